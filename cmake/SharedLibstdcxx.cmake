# Every library and program here shares the process's one libstdc++.so.
#
# The torch extension passes C++ objects (strings, exceptions, streams and
# their locale) to and from libtorch. A g++ whose library path holds
# libstdc++.a but no libstdc++.so (seen on the GPU hosts: CXX=/opt/gcc/bin/g++)
# links a private copy of the parts each library uses. That copy numbers
# locale facets on its own, so it looks up the wrong facet in torch's locale:
# the first number written to a stream in symmpool crashed the process
# (SIGSEGV in SymmWork::wait's timeout message, torch 2.11, H100). Naming the
# shared library ahead of the driver's -lstdc++ resolves every symbol it has
# there; tests/python/test_package.py checks that none came from the archive
# (a libstdc++.so.6 older than the compiler's headers would leave some).
if(NOT CMAKE_CXX_COMPILER_ID STREQUAL "GNU")
  return()
endif()
# The compiler as CMake runs it: CXX="ccache g++" puts g++ in ARG1.
separate_arguments(_symmpool_cxx_args UNIX_COMMAND "${CMAKE_CXX_COMPILER_ARG1}")
set(_symmpool_cxx ${CMAKE_CXX_COMPILER} ${_symmpool_cxx_args})
execute_process(COMMAND ${_symmpool_cxx} -print-file-name=libstdc++.so
  OUTPUT_VARIABLE _symmpool_libstdcxx RESULT_VARIABLE _symmpool_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _symmpool_rc EQUAL 0)
  message(WARNING "symmpool: could not ask ${_symmpool_cxx} where libstdc++ is; linking as it does")
  return()
endif()
if(IS_ABSOLUTE "${_symmpool_libstdcxx}")
  return()  # -lstdc++ finds the shared library: nothing to do
endif()
execute_process(COMMAND ${_symmpool_cxx} -print-file-name=libstdc++.so.6
  OUTPUT_VARIABLE _symmpool_libstdcxx OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT IS_ABSOLUTE "${_symmpool_libstdcxx}")
  message(FATAL_ERROR "symmpool: ${_symmpool_cxx} links libstdc++ statically and finds no "
    "libstdc++.so.6; libsymmpool and the torch extension must share the process's libstdc++ "
    "(use a compiler that links it dynamically, e.g. CXX=/usr/bin/g++)")
endif()
message(STATUS "symmpool: ${_symmpool_cxx} finds only a static libstdc++; "
  "linking ${_symmpool_libstdcxx} so that every library shares the process's one")
link_libraries(${_symmpool_libstdcxx})
