// seq2seq — an encoder-decoder Transformer (nn::Transformer, PyTorch's nn.Transformer) that learns to reverse a
// sequence of digits, trained and then decoded greedily, on ferry's library outside ferry's tree
// (examples/CMakeLists.txt). The smallest complete use of the encoder, the decoder and their masks:
//
//   src  (B, S) random digits 0-9            -> token + position Embedding -> encoder -> memory (B, S, d)
//   tgt  (B, S) [BOS, y_0 .. y_{S-2}]         -> token + position Embedding -> decoder (causal self-attention,
//                                                 cross-attention over the memory) -> Linear -> (B, S, 10)
//   loss cross-entropy against y = src reversed ("teacher forcing": the decoder sees the true previous digits)
//
// Then greedy decoding of fresh sequences: from BOS, S forward passes, each appending the argmax of the last
// position (on the device: the digits cross to the host once, at the end), and the share of sequences and digits
// reversed right.
//
//   seq2seq [--device auto|cpu|cuda:N|sim] [--steps N] [--batch N] [--length S] [--dim N] [--heads N]
//           [--layers N] [--lr X] [--log-every N] [--eval N] [--seed N]
#include <array>
#include <cstdlib>
#include <iomanip>
#include <iostream>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "example_cli.h"
#include "ferry/ferry.h"
#include "ferry/nn/embedding.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/transformer.h"
#include "ferry/optim.h"

namespace {

using ferry::Tensor;
namespace nn = ferry::nn;

constexpr std::int64_t kDigits = 10;
constexpr std::int64_t kBos = kDigits;  // the decoder's start token

struct Options {
  std::string device = "auto";
  std::int64_t steps = 300, batch = 64, length = 8, dim = 32, heads = 4, layers = 2, log_every = 100, eval = 200;
  double lr = 2e-3;
  std::int64_t seed = 0;
};

// Embeddings for the source digits and the target tokens (digits and BOS), a learned position embedding shared by
// both, the Transformer, and a Linear from d_model to the 10 digits.
class Reverser : public nn::Module {
 public:
  Reverser(const Options& o, const ferry::TensorOptions& on) {
    src_tokens = register_module("src_tokens", std::make_shared<nn::Embedding>(kDigits, o.dim, std::nullopt, on));
    tgt_tokens = register_module("tgt_tokens", std::make_shared<nn::Embedding>(kDigits + 1, o.dim, std::nullopt, on));
    positions = register_module("positions", std::make_shared<nn::Embedding>(o.length, o.dim, std::nullopt, on));
    transformer = register_module(
        "transformer",
        std::make_shared<nn::Transformer>(
            nn::TransformerOptions{.d_model = o.dim, .nhead = o.heads, .num_encoder_layers = o.layers,
                                   .num_decoder_layers = o.layers,
                                   .layer = {.dim_feedforward = 4 * o.dim, .dropout = 0.0, .batch_first = true}},
            on));
    head = register_module("head", std::make_shared<nn::Linear>(o.dim, kDigits, true, on));
  }

  // src (B, S), tgt (B, T <= S) int64 -> logits (B, T, 10): position t sees the source and tgt[:, 0..t].
  Tensor forward(const Tensor& src, const Tensor& tgt) {
    const Tensor src_x = (*src_tokens)(src) + (*positions)(at(src.size(1), src.device()));
    const Tensor tgt_x = (*tgt_tokens)(tgt) + (*positions)(at(tgt.size(1), tgt.device()));
    return (*head)(transformer->forward(src_x, tgt_x, {.tgt_is_causal = true}));
  }
  Tensor forward(const Tensor&) override {
    throw ferry::InvalidArgument("Reverser needs a source and a target: forward(src, tgt)");
  }
  std::string type_name() const override { return "Reverser"; }

  std::shared_ptr<nn::Embedding> src_tokens, tgt_tokens, positions;
  std::shared_ptr<nn::Transformer> transformer;
  std::shared_ptr<nn::Linear> head;

 private:
  static Tensor at(std::int64_t n, ferry::Device device) {  // 0..n-1, int64, on the device
    return ferry::arange(0, static_cast<double>(n), 1, {.device = device, .dtype = ferry::DType::Int64});
  }
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: seq2seq [--device auto|cpu|cuda:N|sim] [--steps N] [--batch N] [--length S] [--dim N]\n"
                   "               [--heads N] [--layers N] [--lr X] [--log-every N] [--eval N] [--seed N]\n"
                   "Trains an encoder-decoder Transformer (--layers encoder and decoder layers of width --dim) to\n"
                   "reverse sequences of S random digits, then decodes --eval fresh sequences greedily and prints\n"
                   "how many it reversed right. Defaults: " << o.steps << " steps of " << o.batch
                << " sequences, S = " << o.length << ", dim " << o.dim << ", " << o.heads << " heads, "
                << o.layers << " layers, lr " << o.lr << ".\n";
      std::exit(0);
    }
    if (i + 1 == argc) throw ferry::InvalidArgument(std::string(arg) + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--device") o.device = value;
    else if (arg == "--steps") o.steps = example::whole(arg, value, 1);
    else if (arg == "--batch") o.batch = example::whole(arg, value, 1);
    else if (arg == "--length") o.length = example::whole(arg, value, 2);
    else if (arg == "--dim") o.dim = example::whole(arg, value, 1);
    else if (arg == "--heads") o.heads = example::whole(arg, value, 1);
    else if (arg == "--layers") o.layers = example::whole(arg, value, 1);
    else if (arg == "--log-every") o.log_every = example::whole(arg, value, 1);
    else if (arg == "--eval") o.eval = example::whole(arg, value, 1);
    else if (arg == "--seed") o.seed = example::whole(arg, value, 0);
    else if (arg == "--lr") o.lr = example::positive_number(arg, value);
    else {
      throw ferry::InvalidArgument("unknown option " + std::string(arg) + " (see --help)");
    }
  }
  if (o.dim % o.heads != 0) {
    throw ferry::InvalidArgument("--dim " + std::to_string(o.dim) + " must divide by --heads " +
                                 std::to_string(o.heads));
  }
  return o;
}

int run(const Options& o) {
  using namespace ferry;
  const Device device = Device::parse(o.device);
  manual_seed(static_cast<std::uint64_t>(o.seed));
  Reverser model(o, {.device = device});
  optim::Adam adam(model.parameters(), {.lr = o.lr});
  std::cout << "seq2seq: reversing " << o.length << " digits; Transformer of " << o.layers << " + " << o.layers
            << " layers, d_model " << o.dim << ", " << model.parameter_count() << " parameters on " << device.str()
            << "; " << o.steps << " steps of " << o.batch << " sequences\n";

  // A batch, made on the device: src digits, the target (src reversed), and the decoder's input (BOS, then the
  // target but its last digit).
  const Tensor reversed_order =
      arange(static_cast<double>(o.length - 1), -1, -1, {.device = device, .dtype = DType::Int64});
  const auto batch = [&](std::int64_t size) {
    const Tensor src = randint(0, kDigits, {size, o.length}, {.device = device});
    const Tensor target = index_select(src, 1, reversed_order);
    const Tensor bos = full({size, 1}, static_cast<double>(kBos), {.device = device, .dtype = DType::Int64});
    return std::array<Tensor, 3>{src, target, cat({bos, target.narrow(1, 0, o.length - 1)}, 1)};
  };
  for (std::int64_t step = 0; step < o.steps; ++step) {
    const auto [src, target, decoder_input] = batch(o.batch);
    adam.zero_grad();
    const Tensor logits = model.forward(src, decoder_input);  // (B, S, 10)
    const Tensor loss = nn::functional::cross_entropy(logits.reshape({-1, kDigits}), target.reshape({-1}));
    loss.backward();
    adam.step();
    if ((step + 1) % o.log_every == 0 || step == 0) {  // the only read-back of a step
      std::cout << "  step " << std::setw(5) << step + 1 << "  loss " << loss.item<double>() << "\n";
    }
  }

  // Greedy decoding: BOS, then S passes each appending the most likely digit at the last position.
  model.eval();
  autograd::NoGradGuard no_grad;
  const auto [src, target, unused] = batch(o.eval);
  Tensor decoded = full({o.eval, 1}, static_cast<double>(kBos), {.device = device, .dtype = DType::Int64});
  for (std::int64_t t = 0; t < o.length; ++t) {
    const Tensor next = argmax(model.forward(src, decoded).select(1, t), 1, true);  // (eval, 1)
    decoded = cat({decoded, next}, 1);
  }
  const Tensor right = eq(decoded.narrow(1, 1, o.length), target);  // (eval, S) bool
  const double digits = mean(right.to(DType::Float32)).item<double>();
  const double sequences = mean(all(right, {1}).to(DType::Float32)).item<double>();
  std::cout << std::fixed << std::setprecision(3) << "greedy decoding of " << o.eval
            << " new sequences: reversed right " << sequences << " of sequences, " << digits << " of digits\n";
  const std::vector<std::int64_t> first_src = src.narrow(0, 0, 1).to_vector<std::int64_t>();
  const std::vector<std::int64_t> first_out = decoded.narrow(0, 0, 1).narrow(1, 1, o.length).to_vector<std::int64_t>();
  std::cout << "  e.g. ";
  for (const std::int64_t d : first_src) std::cout << d;
  std::cout << " -> ";
  for (const std::int64_t d : first_out) std::cout << d;
  std::cout << "\n";
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::guarded_main("seq2seq", [&] { return run(parse(argc, argv)); });
}
