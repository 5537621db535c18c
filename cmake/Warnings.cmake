# dspark_warnings(target): the project's warning set, errors when DSPARK_WERROR is on.
# GCC 13 at -O3 reports -Warray-bounds false positives inside fmt 9's and libstdc++'s inlined code, and
# -Wmaybe-uninitialized ones inside std::map's inlined tree (a ModelConfig temporary's exl3 bit table), on
# Ubuntu 24.04's toolchain of the GPU machines; CI builds with GCC 12, where these warnings stay on.
set(DSPARK_EXTRA_WARNING_FLAGS "")
if(CMAKE_CXX_COMPILER_ID STREQUAL "GNU" AND CMAKE_CXX_COMPILER_VERSION VERSION_GREATER_EQUAL 13)
  set(DSPARK_EXTRA_WARNING_FLAGS -Wno-array-bounds -Wno-stringop-overflow -Wno-maybe-uninitialized)
endif()

function(dspark_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual
      ${DSPARK_EXTRA_WARNING_FLAGS}
      $<$<BOOL:${DSPARK_WERROR}>:-Werror>>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra $<$<BOOL:${DSPARK_WERROR}>:-Werror=all-warnings>>)
endfunction()
