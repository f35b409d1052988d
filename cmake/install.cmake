# Install rules beyond each target's own: run-time search paths that work from any prefix, the
# CMake package (TesseraConfig.cmake, its version file, the exported Tessera::tessera target and
# tessera_add_plugin for third parties) and tessera.pc. Everything installed is relocatable:
# `cmake --install <build> --prefix P` works for any P, whatever CMAKE_INSTALL_PREFIX was.
include(CMakePackageConfigHelpers)

set(TESSERA_CMAKE_INSTALL_DIR ${CMAKE_INSTALL_LIBDIR}/cmake/Tessera)

# TESSERA_ABI_MAJOR and TESSERA_ABI_MINOR (the top-level CMakeLists.txt) go into the package and
# tessera.pc for the package's users (they may refuse a core they were not written for before
# building).

# $ORIGIN-relative rpaths: the command finds libtessera in <prefix>/lib, the plugins one folder up
# from lib/tessera, the mpi backend beside it. The loader finds <prefix>/lib/tessera from where
# libtessera was loaded (core/plugin_loader.c), so the prefix is never compiled in.
file(RELATIVE_PATH _tsr_bin_to_lib /p/${CMAKE_INSTALL_BINDIR} /p/${CMAKE_INSTALL_LIBDIR})
file(RELATIVE_PATH _tsr_plugin_to_lib /p/${TESSERA_PLUGIN_INSTALL_DIR} /p/${CMAKE_INSTALL_LIBDIR})
string(REGEX REPLACE "/$" "" _tsr_plugin_to_lib "${_tsr_plugin_to_lib}")
string(REGEX REPLACE "/$" "" _tsr_bin_to_lib "${_tsr_bin_to_lib}")
if(TARGET tessera_cli)
  set_target_properties(tessera_cli PROPERTIES INSTALL_RPATH "$ORIGIN/${_tsr_bin_to_lib}")
endif()
if(TARGET tessera-mpi)
  set_target_properties(tessera-mpi PROPERTIES INSTALL_RPATH "$ORIGIN")
endif()
get_property(_tsr_plugin_subdirs DIRECTORY ${PROJECT_SOURCE_DIR}/plugins PROPERTY SUBDIRECTORIES)
foreach(_dir ${_tsr_plugin_subdirs})
  get_property(_targets DIRECTORY ${_dir} PROPERTY BUILDSYSTEM_TARGETS)
  foreach(_t ${_targets})
    get_target_property(_type ${_t} TYPE)
    if(_type STREQUAL "MODULE_LIBRARY")
      set_target_properties(${_t} PROPERTIES INSTALL_RPATH "$ORIGIN/${_tsr_plugin_to_lib}")
    endif()
  endforeach()
endforeach()

# The CMake package: find_package(Tessera) gives Tessera::tessera, tessera_add_plugin() and the
# paths of the installed command and plugin folder.
install(EXPORT TesseraTargets NAMESPACE Tessera:: FILE TesseraTargets.cmake
  DESTINATION ${TESSERA_CMAKE_INSTALL_DIR})
configure_package_config_file(${PROJECT_SOURCE_DIR}/cmake/TesseraConfig.cmake.in
  ${PROJECT_BINARY_DIR}/cmake/TesseraConfig.cmake
  INSTALL_DESTINATION ${TESSERA_CMAKE_INSTALL_DIR}
  PATH_VARS CMAKE_INSTALL_INCLUDEDIR CMAKE_INSTALL_LIBDIR CMAKE_INSTALL_BINDIR
            TESSERA_PLUGIN_INSTALL_DIR)
# Before 1.0 a minor release may change the C API, so only the same major.minor is compatible.
write_basic_package_version_file(${PROJECT_BINARY_DIR}/cmake/TesseraConfigVersion.cmake
  VERSION ${PROJECT_VERSION} COMPATIBILITY SameMinorVersion)
install(FILES ${PROJECT_BINARY_DIR}/cmake/TesseraConfig.cmake
              ${PROJECT_BINARY_DIR}/cmake/TesseraConfigVersion.cmake
              ${PROJECT_SOURCE_DIR}/cmake/TesseraPlugin.cmake
  DESTINATION ${TESSERA_CMAKE_INSTALL_DIR})

# pkg-config: the prefix is taken from where tessera.pc lies, so the file too is relocatable.
file(RELATIVE_PATH TESSERA_PC_TO_PREFIX /p/${CMAKE_INSTALL_LIBDIR}/pkgconfig /p)
string(REGEX REPLACE "/$" "" TESSERA_PC_TO_PREFIX "${TESSERA_PC_TO_PREFIX}")
configure_file(${PROJECT_SOURCE_DIR}/cmake/tessera.pc.in ${PROJECT_BINARY_DIR}/cmake/tessera.pc
  @ONLY)
install(FILES ${PROJECT_BINARY_DIR}/cmake/tessera.pc
  DESTINATION ${CMAKE_INSTALL_LIBDIR}/pkgconfig)
