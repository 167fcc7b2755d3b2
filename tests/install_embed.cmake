# install_and_embed: installs this build tree into a scratch prefix, then
# configures, builds and runs examples/embed against it through
# find_package(tether CONFIG): a host on <tether/tether.hpp> whose echo agent
# spawns a background subagent; it exits 0 only if the subagent's report
# reached the parent, and prints the parent's inbox, checked here. Run by ctest (tests/CMakeLists.txt):
#   cmake -DSRC=<source dir> -DBIN=<build dir> -DWORK=<scratch dir>
#         -DGENERATOR=<generator> -DCXX=<compiler> -P install_embed.cmake
# The scratch dir is removed on success and kept on failure for a look.
foreach(v SRC BIN WORK GENERATOR CXX)
  if(NOT DEFINED ${v})
    message(FATAL_ERROR "install_embed.cmake needs -D${v}=...")
  endif()
endforeach()
file(REMOVE_RECURSE "${WORK}")

function(step what)
  execute_process(COMMAND ${ARGN} RESULT_VARIABLE rc OUTPUT_VARIABLE out ERROR_VARIABLE out)
  if(NOT rc EQUAL 0)
    message(FATAL_ERROR "${what} failed (${rc}); ${WORK} was kept:\n${out}")
  endif()
  message(STATUS "${what}: ok")
  set(step_output "${out}" PARENT_SCOPE)
endfunction()

# Installs what the build produced: build the whole tree first (make build).
step("cmake --install (needs a fully built ${BIN})" "${CMAKE_COMMAND}" --install "${BIN}"
     --prefix "${WORK}/prefix")
# The test harness (scenario runner, scripted agents) is not part of the library.
file(GLOB_RECURSE harness "${WORK}/prefix/include/tether/testing/*"
     "${WORK}/prefix/include/tether/actors/scenario.hpp"
     "${WORK}/prefix/include/tether/actors/scripted_agent.hpp")
if(harness)
  message(FATAL_ERROR "the install ships the test harness: ${harness}; ${WORK} was kept")
endif()
step("configure examples/embed" "${CMAKE_COMMAND}" -S "${SRC}/examples/embed" -B "${WORK}/build"
     -G "${GENERATOR}" "-DCMAKE_CXX_COMPILER=${CXX}" "-DCMAKE_PREFIX_PATH=${WORK}/prefix"
     -DCMAKE_FIND_USE_PACKAGE_REGISTRY=OFF)
step("build examples/embed" "${CMAKE_COMMAND}" --build "${WORK}/build")
step("run embed" "${WORK}/build/embed")
message(STATUS "${step_output}")
if(NOT step_output MATCHES "Parent inbox \\(ses_[^)]+\\):\n  \\[[^ ]+\\] from ses_[^,]+, acknowledged")
  message(FATAL_ERROR "embed did not print the subagent's acknowledged report in the parent's "
                      "inbox; ${WORK} was kept")
endif()
file(REMOVE_RECURSE "${WORK}")
