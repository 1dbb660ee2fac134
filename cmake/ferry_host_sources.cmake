# ferry_host_sources.cmake — the host sources of the layers below nn (core, cpu, sim, ledger, autograd) and the
# compile options some of them need. Shared by the library (src/CMakeLists.txt) and the fuzz project
# (fuzz/CMakeLists.txt), so a new host file reaches both builds, built the same way.

# ferry_host_sources(OUT SRC_DIR): OUT = every .cpp of those layers under SRC_DIR (the repository's src/).
function(ferry_host_sources out src_dir)
  file(GLOB_RECURSE sources CONFIGURE_DEPENDS
    ${src_dir}/core/*.cpp ${src_dir}/cpu/*.cpp ${src_dir}/sim/*.cpp ${src_dir}/ledger/*.cpp ${src_dir}/autograd/*.cpp)
  set(${out} ${sources} PARENT_SCOPE)
endfunction()

# ferry_host_source_options(SRC_DIR): the per-file options, set in the calling directory (source properties are
# per directory).
macro(ferry_host_source_options src_dir)
  # The fused SGD and Adam steps round like the op-by-op ones: no multiply-add contraction (-march=x86-64-v3 has
  # FMA). GELU's and LayerNorm's host loops round as the composed layers' separate kernels (and the cuda kernels'
  # _rn intrinsics) round each operation: no contraction either.
  set_source_files_properties(${src_dir}/cpu/sgd.cpp ${src_dir}/cpu/adam.cpp ${src_dir}/cpu/layer_norm.cpp
                              PROPERTIES COMPILE_OPTIONS -ffp-contract=off)
  # exp and erf loops vectorise only when GCC may drop the FP exception flags of a NaN compare (src/cpu/vec_math.h).
  set_source_files_properties(${src_dir}/cpu/host_kernels.cpp ${src_dir}/cpu/rnn_cells.cpp ${src_dir}/cpu/softmax.cpp
                              PROPERTIES COMPILE_OPTIONS -fno-trapping-math)
  set_source_files_properties(${src_dir}/cpu/gelu.cpp PROPERTIES COMPILE_OPTIONS "-fno-trapping-math;-ffp-contract=off")
endmacro()
