/* TSR_API marks the functions libtessera exports. The library is built with hidden visibility,
 * so a function without it stays internal however it is declared; the exported-symbols test
 * checks that the library exports exactly what the public headers mark. */
#ifndef TESSERA_EXPORT_H
#define TESSERA_EXPORT_H

#if defined(__GNUC__) || defined(__clang__)
#define TSR_API __attribute__((visibility("default")))
#else
#define TSR_API
#endif

#endif
