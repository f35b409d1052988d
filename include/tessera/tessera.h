/* Umbrella header: the whole public API of libtessera. */
#ifndef TESSERA_TESSERA_H
#define TESSERA_TESSERA_H

#include "tessera/status.h"
#include "tessera/breadcrumb.h"
#include "tessera/tensor.h"
#include "tessera/comm.h"
#include "tessera/mesh.h"
#include "tessera/rank.h"
#include "tessera/dtensor.h"
#include "tessera/device.h"
#include "tessera/registry.h"
#include "tessera/trace.h"
#include "tessera/version.h"

#endif
