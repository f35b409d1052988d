# Safetensors headers are JSON; cJSON parses them.
pkg_check_modules(CJSON REQUIRED IMPORTED_TARGET libcjson)
target_link_libraries(tessera PRIVATE PkgConfig::CJSON)
