# tokenizer.json pre-tokenizers are Unicode regexes (\p{L}, lookahead): PCRE2 matches them.
# tokenizer.json itself is JSON: cJSON (core/io.cmake) parses it.
pkg_check_modules(PCRE2 REQUIRED IMPORTED_TARGET libpcre2-8)
target_link_libraries(tessera PRIVATE PkgConfig::PCRE2)
