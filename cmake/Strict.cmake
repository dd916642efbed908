# Note [strict numerics flags]
# The bit-faithfulness contract (docs/numerics.md) depends on these flags: no FMA contraction
# (a fused multiply-add happens only where the source says fma()), no fast math, IEEE division
# and square root, denormals kept. They are attached to every target through lockstep_strict and
# also set globally so that tests and tools are compiled the same way.
add_library(lockstep_strict INTERFACE)
target_compile_options(lockstep_strict INTERFACE
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off -fno-fast-math -fno-finite-math-only>
  $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false --ftz=false --prec-div=true --prec-sqrt=true
                              -Xcompiler=-ffp-contract=off --expt-relaxed-constexpr>)
add_compile_options(
  $<$<COMPILE_LANGUAGE:CXX>:-ffp-contract=off>
  $<$<COMPILE_LANGUAGE:CUDA>:--fmad=false>
  $<$<COMPILE_LANGUAGE:CUDA>:--ftz=false>
  $<$<COMPILE_LANGUAGE:CUDA>:--prec-div=true>
  $<$<COMPILE_LANGUAGE:CUDA>:--prec-sqrt=true>)
# Every place a flag can come from at configure time: the language flags (also CXXFLAGS and
# CUDAFLAGS from the environment) and those of each build type, the standard ones and any named
# by CMAKE_BUILD_TYPE or CMAKE_CONFIGURATION_TYPES. Checked now and again at the end of the
# top-level configure, after enable_language(CUDA) has read CUDAFLAGS.
function(_lockstep_refuse_fast_math)
  set(flags "${CMAKE_CXX_FLAGS} ${CMAKE_CUDA_FLAGS}")
  set(configs DEBUG RELEASE RELWITHDEBINFO MINSIZEREL ${CMAKE_BUILD_TYPE} ${CMAKE_CONFIGURATION_TYPES})
  foreach(config IN LISTS configs)
    string(TOUPPER "${config}" config)
    string(APPEND flags " ${CMAKE_CXX_FLAGS_${config}} ${CMAKE_CUDA_FLAGS_${config}}")
  endforeach()
  foreach(flag -ffast-math -Ofast -funsafe-math-optimizations --use_fast_math)
    string(FIND "${flags}" "${flag}" pos)
    if(NOT pos EQUAL -1)
      message(FATAL_ERROR "lockstep: ${flag} breaks the numerics contract (docs/numerics.md)")
    endif()
  endforeach()
endfunction()
_lockstep_refuse_fast_math()
cmake_language(DEFER CALL _lockstep_refuse_fast_math)
install(TARGETS lockstep_strict EXPORT lockstepTargets)
