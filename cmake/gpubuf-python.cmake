# Decide whether to build the Python package (python/). Sets GPUBUF_HAVE_PYTHON
# and, when set: Python3_EXECUTABLE, GPUBUF_PYTHON_INCLUDE (Python.h, from the
# interpreter's sysconfig, so a virtual environment of a standalone CPython
# works too), GPUBUF_PYTHON_EXT_SUFFIX, DLPACK_INCLUDE_DIR and
# GPUBUF_PYTHON_INSTALL_DIR (relative to the install prefix).
#
# GPUBUF_WITH_PYTHON: AUTO builds it when the interpreter's Python.h, NumPy and
# dlpack.h (and pytest, for the tests) are found and no sanitizer is on (a sanitized extension
# loads into a plain interpreter only with the ASan runtime preloaded, which the tests do:
# python/CMakeLists.txt); ON requires it; OFF skips it. Choose the
# interpreter with -DPython3_EXECUTABLE=/usr/bin/python3.
set(GPUBUF_WITH_PYTHON AUTO CACHE STRING "Build the Python package gpubuf (AUTO, ON, OFF)")
set_property(CACHE GPUBUF_WITH_PYTHON PROPERTY STRINGS AUTO ON OFF)
set(GPUBUF_HAVE_PYTHON OFF)

function(gpubuf_python_missing why)
  if(GPUBUF_WITH_PYTHON STREQUAL "ON")
    message(FATAL_ERROR "GPUBUF_WITH_PYTHON=ON but ${why}")
  endif()
  message(STATUS "gpubuf: Python package not built: ${why}")
endfunction()

if(GPUBUF_WITH_PYTHON STREQUAL "OFF")
  return()
endif()
if(GPUBUF_SANITIZER AND GPUBUF_WITH_PYTHON STREQUAL "AUTO")
  message(STATUS "gpubuf: Python package not built with sanitizers (GPUBUF_WITH_PYTHON=ON forces it)")
  return()
endif()
find_package(Python3 COMPONENTS Interpreter)
if(NOT Python3_Interpreter_FOUND)
  gpubuf_python_missing("no Python 3 interpreter was found (python3)")
  return()
endif()
execute_process(
  COMMAND ${Python3_EXECUTABLE} -c
    "import os, sysconfig; print(sysconfig.get_paths()['include']); print(sysconfig.get_config_var('EXT_SUFFIX')); print(os.path.relpath(sysconfig.get_path('platlib', 'posix_prefix', vars={'base': '/P', 'platbase': '/P'}), '/P'))"
  OUTPUT_VARIABLE _py_out RESULT_VARIABLE _py_rc OUTPUT_STRIP_TRAILING_WHITESPACE)
if(NOT _py_rc EQUAL 0)
  gpubuf_python_missing("${Python3_EXECUTABLE} cannot report its sysconfig")
  return()
endif()
string(REPLACE "\n" ";" _py_out "${_py_out}")
list(GET _py_out 0 _py_include)
list(GET _py_out 1 _py_suffix)
list(GET _py_out 2 _py_platlib)
if(NOT EXISTS "${_py_include}/Python.h")
  gpubuf_python_missing("${_py_include}/Python.h is missing (Debian: python3-dev)")
  return()
endif()
execute_process(COMMAND ${Python3_EXECUTABLE} -c "import numpy"
  RESULT_VARIABLE _np_rc OUTPUT_QUIET ERROR_QUIET)
# NumPy is needed by the tests, not by the build: ON builds without it.
if(NOT _np_rc EQUAL 0 AND (GPUBUF_BUILD_TESTS OR GPUBUF_WITH_PYTHON STREQUAL "AUTO"))
  gpubuf_python_missing("${Python3_EXECUTABLE} cannot import numpy (Debian: python3-numpy)")
  return()
endif()
find_path(DLPACK_INCLUDE_DIR dlpack/dlpack.h)
if(NOT DLPACK_INCLUDE_DIR)
  gpubuf_python_missing("dlpack/dlpack.h was not found (Debian: libdlpack-dev)")
  return()
endif()
if(GPUBUF_BUILD_TESTS)
  execute_process(COMMAND ${Python3_EXECUTABLE} -c "import pytest"
    RESULT_VARIABLE _pt_rc OUTPUT_QUIET ERROR_QUIET)
  if(NOT _pt_rc EQUAL 0)
    gpubuf_python_missing("${Python3_EXECUTABLE} cannot import pytest for the tests (Debian: python3-pytest)")
    return()
  endif()
endif()
set(GPUBUF_PYTHON_INSTALL_DIR "${_py_platlib}" CACHE STRING
  "Where cmake --install puts the Python package, relative to the prefix")
set(GPUBUF_PYTHON_INCLUDE "${_py_include}")
set(GPUBUF_PYTHON_EXT_SUFFIX "${_py_suffix}")
set(GPUBUF_HAVE_PYTHON ON)
message(STATUS "gpubuf: Python package for ${Python3_EXECUTABLE} (${_py_include}), installs into ${GPUBUF_PYTHON_INSTALL_DIR}")
