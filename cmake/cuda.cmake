# CUDA parts (kernels/cuda, backends/nccl): TESSERA_CUDA=AUTO|ON|OFF.
