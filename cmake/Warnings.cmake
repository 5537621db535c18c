# dspark_warnings(target): the project's warning set, errors when DSPARK_WERROR is on.
function(dspark_warnings target)
  target_compile_options(${target} PRIVATE
    $<$<COMPILE_LANGUAGE:CXX>:-Wall -Wextra -Wpedantic -Wshadow -Wnon-virtual-dtor -Woverloaded-virtual
      $<$<BOOL:${DSPARK_WERROR}>:-Werror>>
    $<$<COMPILE_LANGUAGE:CUDA>:-Xcompiler=-Wall,-Wextra $<$<BOOL:${DSPARK_WERROR}>:-Werror=all-warnings>>)
endfunction()
