# tessera_add_plugin(<name> [OUTPUT_DIR <dir>] [INSTALL_DESTINATION <dir>] <sources>...)
#
# Builds the strategy plugin libtessera-<name>.so (target tessera-<name>): a MODULE library linked
# to Tessera::tessera, C11, hidden visibility so that only the TSR_PLUGIN_EXPORT entry point is
# exported. The file goes to OUTPUT_DIR (default: the current binary folder), which a job names in
# [plugins] path or TESSERA_PLUGIN_PATH. With INSTALL_DESTINATION, `cmake --install` puts it
# there, relative to the plugin project's prefix (pass ${TESSERA_PLUGIN_DIR} to install beside the
# core's plugins); without it the plugin is not installed.
#
# One function for both sides: find_package(Tessera) gives it to third parties, with the installed
# core as Tessera::tessera, and Tessera's own build includes this file for its plugins, with
# Tessera::tessera an alias of the core target. The in-tree plugins therefore build exactly as a
# third party's do.
function(tessera_add_plugin name)
  cmake_parse_arguments(ARG "" "OUTPUT_DIR;INSTALL_DESTINATION" "" ${ARGN})
  if(NOT TARGET Tessera::tessera)
    message(FATAL_ERROR "tessera_add_plugin(${name}): no target Tessera::tessera; call "
                        "find_package(Tessera) first")
  endif()
  if(NOT ARG_UNPARSED_ARGUMENTS)
    message(FATAL_ERROR "tessera_add_plugin(${name}): no source files")
  endif()
  if(NOT name MATCHES "^[A-Za-z0-9_]+$")
    message(FATAL_ERROR "tessera_add_plugin(${name}): the name becomes libtessera-${name}.so and "
                        "the INI's [strategy.${name}]; use letters, digits and '_'")
  endif()
  if(NOT ARG_OUTPUT_DIR)
    set(ARG_OUTPUT_DIR ${CMAKE_CURRENT_BINARY_DIR})
  endif()
  add_library(tessera-${name} MODULE ${ARG_UNPARSED_ARGUMENTS})
  target_link_libraries(tessera-${name} PRIVATE Tessera::tessera)
  set_target_properties(tessera-${name} PROPERTIES
    PREFIX "lib"
    OUTPUT_NAME tessera-${name}
    SUFFIX ".so"
    C_STANDARD 11
    C_STANDARD_REQUIRED ON
    C_VISIBILITY_PRESET hidden
    LIBRARY_OUTPUT_DIRECTORY ${ARG_OUTPUT_DIR})
  if(ARG_INSTALL_DESTINATION)
    install(TARGETS tessera-${name} LIBRARY DESTINATION ${ARG_INSTALL_DESTINATION})
  endif()
endfunction()
