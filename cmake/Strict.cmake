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
# Every place a flag can come from at configure time: the language flags and each build type's.
set(_lockstep_all_flags "${CMAKE_CXX_FLAGS} ${CMAKE_CUDA_FLAGS}")
foreach(config DEBUG RELEASE RELWITHDEBINFO MINSIZEREL)
  string(APPEND _lockstep_all_flags " ${CMAKE_CXX_FLAGS_${config}} ${CMAKE_CUDA_FLAGS_${config}}")
endforeach()
foreach(flag -ffast-math -Ofast -funsafe-math-optimizations --use_fast_math)
  string(FIND "${_lockstep_all_flags}" "${flag}" pos)
  if(NOT pos EQUAL -1)
    message(FATAL_ERROR "lockstep: ${flag} breaks the numerics contract (docs/numerics.md)")
  endif()
endforeach()
install(TARGETS lockstep_strict EXPORT lockstepTargets)
