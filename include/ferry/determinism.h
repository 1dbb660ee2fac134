// ferry/determinism.h — one switch that makes every run of the same program on the same machine give
// the same bits, as PyTorch's torch.use_deterministic_algorithms(True) with cudnn.benchmark off.
// Not here: the random generator (ferry/random.h; its numbers are the same on every device regardless).
//
// Off (the default), ferry may use the fastest algorithm it can find, including ones whose sums run in
// a different order on every call:
//   - cuDNN's convolution algorithms are chosen by timing them (cudnnFind*), once per shape and process, so two
//     processes may choose differently; some of them (backward-data algo 0, backward-filter algos 0 and 3) add
//     with atomics;
//   - index_add (index_select's backward) adds with atomics on cuda.
// On, cuda runs only algorithms that sum in a fixed order, chosen without timing (cuDNN's heuristics: no
// device sync, the same choice in every process on the same card and cuDNN), and index_add sums each
// column in the cpu's order, so it matches the cpu bit for bit. That is what `ferry train --resume` needs
// to continue a cuda run bit for bit. The cpu backend is deterministic either way (for a given thread
// count and host_parallel_work_scale(), ferry/backend.h), and so are cuBLAS (same card, same library),
// ferry's own reductions and NCCL (same ranks).
// The price: the deterministic algorithm may be slower than the fastest (measured by scripts/gpu-check).
#pragma once

namespace ferry {

// Process-wide; read when a layer chooses its algorithm (a convolution shape met before the switch keeps its
// plan for the old setting and gets a new one for the new setting). Initially on when the environment has
// FERRY_DETERMINISTIC=1.
void use_deterministic_algorithms(bool on);
bool deterministic_algorithms();

// Sets the switch for a scope and puts the previous setting back at its end (ferry::train uses it for a run).
class DeterministicAlgorithmsGuard {
 public:
  explicit DeterministicAlgorithmsGuard(bool on) : previous_(deterministic_algorithms()) {
    use_deterministic_algorithms(on);
  }
  ~DeterministicAlgorithmsGuard() { use_deterministic_algorithms(previous_); }
  DeterministicAlgorithmsGuard(const DeterministicAlgorithmsGuard&) = delete;
  DeterministicAlgorithmsGuard& operator=(const DeterministicAlgorithmsGuard&) = delete;

 private:
  bool previous_;
};

}  // namespace ferry
