# Install rules, tessera.pc and the CMake package (TesseraConfig.cmake) for out-of-tree plugins.
