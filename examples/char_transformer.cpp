// char_transformer — a small GPT (decoder-only transformer), or with --model lstm|gru a char-rnn, trained on the
// characters of any text file, on ferry's library, outside ferry's tree (examples/CMakeLists.txt). llm.c's loop in
// a page of C++:
//
//   tokens resident on the device once; each step's batch picked there (randint + index_select: no copy);
//   Embedding + position Embedding -> N x [LayerNorm, causal MultiheadAttention, LayerNorm, Linear-GELU-Linear]
//   -> LayerNorm -> Linear to the vocabulary (char-rnn: Embedding -> --layers of LSTM or GRU -> Linear); cross-entropy; AdamW (weight decay on the matrices only: two
//   parameter groups, as nanoGPT) with a warmup then cosine schedule (SequentialLR), gradients clipped to norm 1
//   (on the device); the loss read back every --log-every steps. On cuda (--graphs auto) the step (forward, loss,
//   backward, clipping, AdamW's update) is captured as one CUDA graph after two eager steps and replayed: AdamW is
//   capturable, its step counts and learning rates on the device, so the schedule goes on.
//
// Then it writes --sample characters, one forward pass each, drawn on the device (multinomial): the text is read
// back once, at the end, one sync for the whole sample.
//
//   char_transformer [--text FILE] [--model gpt|lstm|gru] [--device auto|cpu|cuda:N|sim] [--steps N] [--batch N]
//                    [--context N] [--dim N] [--heads N] [--layers N] [--lr X] [--log-every N] [--sample N]
//                    [--seed N] [--graphs auto|on|off] [--json]
//
// --json: one JSON object on stdout, the seconds per step after three warm-up steps (timed between two host syncs,
// so a GPU's queued work counts) and the last loss, as bench/torch_char_transformer.py prints PyTorch's; the
// rest goes to stderr.
#include <algorithm>
#include <array>
#include <chrono>
#include <cmath>
#include <cstdlib>
#include <fstream>
#include <iostream>
#include <iterator>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "example_cli.h"
#include "ferry/ferry.h"
#include "ferry/lr_scheduler.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/attention.h"
#include "ferry/nn/clip_grad.h"
#include "ferry/nn/embedding.h"
#include "ferry/nn/functional.h"
#include "ferry/nn/init.h"
#include "ferry/nn/layernorm.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/module_list.h"
#include "ferry/nn/rnn.h"
#include "ferry/optim.h"
#include "ferry/phase.h"
#include "ferry/report.h"
#include "ferry/step_graph.h"

namespace {

using ferry::Tensor;
namespace nn = ferry::nn;

struct Options {
  std::string text = "/usr/share/common-licenses/GPL-3";  // any text; Debian ships this one everywhere
  std::string model = "gpt";  // or lstm, gru
  std::string device = "auto";
  std::int64_t steps = 300, batch = 32, context = 64, dim = 64, heads = 4, layers = 2, log_every = 50, sample = 300;
  double lr = 3e-3;
  std::int64_t seed = 0;
  bool json = false;  // one JSON object on stdout (seconds per step, last loss); the rest on stderr
  std::string graphs = "auto";  // capture the step as a graph: auto (on cuda), on (cuda or sim), off
};

// One transformer block, pre-norm as GPT-2: x + attention(ln(x)), then x + mlp(ln(x)).
class Block : public nn::Module {
 public:
  Block(std::int64_t dim, std::int64_t heads, const ferry::TensorOptions& on) {
    ln1 = register_module("ln1", std::make_shared<nn::LayerNorm>(ferry::Shape{dim}, 1e-5, true, on));
    attn = register_module("attn", std::make_shared<nn::MultiheadAttention>(
                                       dim, heads, nn::MultiheadAttentionOptions{.batch_first = true}, on));
    ln2 = register_module("ln2", std::make_shared<nn::LayerNorm>(ferry::Shape{dim}, 1e-5, true, on));
    up = register_module("up", std::make_shared<nn::Linear>(dim, 4 * dim, true, on));
    down = register_module("down", std::make_shared<nn::Linear>(4 * dim, dim, true, on));
  }
  Tensor forward(const Tensor& x) override {  // (B, T, dim)
    nn::AttendOptions causal;
    causal.is_causal = true;
    causal.need_weights = false;
    const Tensor normed = (*ln1)(x);
    const Tensor h = x + attn->attend(normed, normed, normed, causal).output;
    return h + (*down)(nn::functional::gelu((*up)((*ln2)(h))));
  }
  std::string type_name() const override { return "Block"; }

  std::shared_ptr<nn::LayerNorm> ln1, ln2;
  std::shared_ptr<nn::MultiheadAttention> attn;
  std::shared_ptr<nn::Linear> up, down;
};

class CharTransformer : public nn::Module {
 public:
  CharTransformer(std::int64_t vocab, const Options& o, const ferry::TensorOptions& on) {
    tokens = register_module("tokens", std::make_shared<nn::Embedding>(vocab, o.dim, std::nullopt, on));
    positions = register_module("positions", std::make_shared<nn::Embedding>(o.context, o.dim, std::nullopt, on));
    nn::init::normal_(tokens->weight, 0, 0.02);  // GPT-2's scale, not Embedding's N(0, 1)
    nn::init::normal_(positions->weight, 0, 0.02);
    blocks = register_module("blocks", std::make_shared<nn::ModuleList>());  // "blocks.0.ln1.weight", ...
    for (std::int64_t i = 0; i < o.layers; ++i) blocks->push_back(std::make_shared<Block>(o.dim, o.heads, on));
    ln_f = register_module("ln_f", std::make_shared<nn::LayerNorm>(ferry::Shape{o.dim}, 1e-5, true, on));
    head = register_module("head", std::make_shared<nn::Linear>(o.dim, vocab, true, on));
  }
  Tensor forward(const Tensor& ids) override {  // (B, T) int64 -> (B, T, vocab) logits
    const std::int64_t t = ids.size(1);
    const Tensor where =
        ferry::arange(0, static_cast<double>(t), 1, {.device = ids.device(), .dtype = ferry::DType::Int64});
    Tensor x = (*tokens)(ids) + (*positions)(where);
    for (const auto& block : blocks->children()) x = (*block)(x);
    return (*head)((*ln_f)(x));
  }
  std::string type_name() const override { return "CharTransformer"; }

  std::shared_ptr<nn::Embedding> tokens, positions;
  std::shared_ptr<nn::ModuleList> blocks;
  std::shared_ptr<nn::LayerNorm> ln_f;
  std::shared_ptr<nn::Linear> head;
};

// Karpathy's char-rnn: each character's embedding through --layers of LSTM (or GRU) cells, batch first, then a
// Linear to the vocabulary at every step.
class CharRnn : public nn::Module {
 public:
  CharRnn(std::int64_t vocab, const Options& o, const ferry::TensorOptions& on) {
    tokens = register_module("tokens", std::make_shared<nn::Embedding>(vocab, o.dim, std::nullopt, on));
    const nn::RNNOptions layers{.num_layers = o.layers, .batch_first = true};
    if (o.model == "lstm") rnn = register_module("rnn", std::make_shared<nn::LSTM>(o.dim, o.dim, layers, on));
    else rnn = register_module("rnn", std::make_shared<nn::GRU>(o.dim, o.dim, layers, on));
    head = register_module("head", std::make_shared<nn::Linear>(o.dim, vocab, true, on));
  }
  Tensor forward(const Tensor& ids) override { return (*head)((*rnn)((*tokens)(ids))); }  // (B, T) -> (B, T, vocab)
  std::string type_name() const override { return "CharRnn"; }

  std::shared_ptr<nn::Embedding> tokens;
  std::shared_ptr<nn::RNNBase> rnn;
  std::shared_ptr<nn::Linear> head;
};

Options parse(int argc, char** argv) {
  Options o;
  for (int i = 1; i < argc; ++i) {
    const std::string_view arg = argv[i];
    if (arg == "--help" || arg == "-h") {
      std::cout << "usage: char_transformer [--text FILE] [--model gpt|lstm|gru] [--device auto|cpu|cuda:N|sim]\n"
                   "                        [--steps N] [--batch N] [--context N] [--dim N] [--heads N] [--layers N]\n"
                   "                        [--lr X] [--log-every N] [--sample N] [--seed N]\n"
                   "                        [--graphs auto|on|off] [--json]\n"
                   "Trains a small GPT (or, with --model lstm or gru, a char-rnn of --layers recurrent layers of\n"
                   "--dim units; --heads is the GPT's) on the characters of FILE (default " << o.text << "),\n"
                   "then writes --sample characters from it. --json prints one JSON object on stdout: the seconds\n"
                   "per step after three warm-up steps, timed between two host syncs, and the last loss.\n"
                   "--graphs: capture the step (forward, loss, backward, clipping, AdamW) as one graph after two\n"
                   "eager steps and replay it: auto (on cuda: one launch instead of hundreds), on (cuda or sim),\n"
                   "off.\n";
      std::exit(0);
    }
    if (arg == "--json") {
      o.json = true;
      continue;
    }
    if (i + 1 == argc) throw ferry::InvalidArgument(std::string(arg) + " needs a value (see --help)");
    const std::string value = argv[++i];
    if (arg == "--text") o.text = value;
    else if (arg == "--model") o.model = value;
    else if (arg == "--device") o.device = value;
    else if (arg == "--steps") o.steps = example::whole(arg, value, 1);
    else if (arg == "--batch") o.batch = example::whole(arg, value, 1);
    else if (arg == "--context") o.context = example::whole(arg, value, 2);
    else if (arg == "--dim") o.dim = example::whole(arg, value, 1);
    else if (arg == "--heads") o.heads = example::whole(arg, value, 1);
    else if (arg == "--layers") o.layers = example::whole(arg, value, 1);
    else if (arg == "--log-every") o.log_every = example::whole(arg, value, 1);
    else if (arg == "--sample") o.sample = example::whole(arg, value, 0);
    else if (arg == "--seed") o.seed = example::whole(arg, value, 0);
    else if (arg == "--lr") o.lr = example::positive_number(arg, value);
    else if (arg == "--graphs") o.graphs = value;
    else {
      throw ferry::InvalidArgument("unknown option " + std::string(arg) + " (see --help)");
    }
  }
  if (o.model != "gpt" && o.model != "lstm" && o.model != "gru") {
    throw ferry::InvalidArgument("--model wants gpt, lstm or gru, not '" + o.model + "'");
  }
  if (o.graphs != "auto" && o.graphs != "on" && o.graphs != "off") {
    throw ferry::InvalidArgument("--graphs wants auto, on or off, not '" + o.graphs + "'");
  }
  if (o.model == "gpt" && o.dim % o.heads != 0) {
    throw ferry::InvalidArgument("--dim " + std::to_string(o.dim) + " must divide by --heads " +
                                 std::to_string(o.heads));
  }
  return o;
}

int run(const Options& o) {
  using namespace ferry;
  const Device device = Device::parse(o.device);
  manual_seed(static_cast<std::uint64_t>(o.seed));
  if (o.graphs == "on" && device.is_cpu()) {
    throw InvalidArgument("--graphs on captures steps on cuda or sim; the cpu runs every step eagerly (use auto or "
                          "off)");
  }
  const bool graphs = o.graphs == "on" || (o.graphs == "auto" && device.is_cuda());

  std::ifstream file(o.text, std::ios::binary);
  if (!file) throw IoError("cannot read '" + o.text + "' (give any text file with --text)");
  const std::string text((std::istreambuf_iterator<char>(file)), std::istreambuf_iterator<char>());
  if (static_cast<std::int64_t>(text.size()) < o.context + 2) {
    throw InvalidArgument("'" + o.text + "' has " + std::to_string(text.size()) + " characters; --context " +
                          std::to_string(o.context) + " needs at least " + std::to_string(o.context + 2));
  }
  // The vocabulary: the bytes that occur, in byte order.
  std::array<std::int64_t, 256> id{};
  id.fill(-1);
  std::vector<char> chars;
  for (const unsigned char c : text) id[c] = 0;
  for (int c = 0; c < 256; ++c)
    if (id[c] == 0) id[c] = static_cast<std::int64_t>(chars.size()), chars.push_back(static_cast<char>(c));
  const auto vocab = static_cast<std::int64_t>(chars.size());
  std::vector<std::int64_t> ids(text.size());
  for (std::size_t i = 0; i < text.size(); ++i) ids[i] = id[static_cast<unsigned char>(text[i])];
  const Tensor data = from_vector(ids, {static_cast<std::int64_t>(ids.size())}).to(device);  // resident: one copy

  std::shared_ptr<nn::Module> network;
  if (o.model == "gpt") network = std::make_shared<CharTransformer>(vocab, o, TensorOptions{.device = device});
  else network = std::make_shared<CharRnn>(vocab, o, TensorOptions{.device = device});
  nn::Module& model = *network;
  std::vector<Tensor> matrices, others;  // weight decay for the weight matrices and embeddings, none for biases and norms
  for (const auto& [name, p] : model.named_parameters()) (p.dim() >= 2 ? matrices : others).push_back(p);
  optim::AdamW adamw({{.params = matrices}, {.params = others, .weight_decay = 0.0}},
                     {.lr = o.lr, .weight_decay = 0.1, .capturable = graphs});
  const std::int64_t warmup = std::max<std::int64_t>(1, o.steps / 10);
  auto ramp = std::make_shared<optim::LinearLR>(adamw, 0.01, 1.0, warmup);
  auto decay =
      std::make_shared<optim::CosineAnnealingLR>(adamw, std::max<std::int64_t>(1, o.steps - warmup), o.lr / 10);
  optim::SequentialLR schedule(adamw, {ramp, decay}, {warmup});
  std::ostream& say = o.json ? std::cerr : std::cout;  // with --json, stdout holds the JSON object alone
  say << "char_transformer: " << text.size() << " characters of " << o.text << ", " << vocab << " distinct; "
      << o.model << ", " << model.parameter_count() << " parameters on " << device.str() << "; " << o.steps
      << " steps of " << o.batch << " x " << o.context << " tokens\n";

  // A batch, on the device: random starts, then the windows of tokens after them (inputs) and one further on
  // (targets). No byte crosses the link inside a step.
  const Tensor offsets = arange(0, static_cast<double>(o.context), 1, {.device = device, .dtype = DType::Int64});
  const auto batch = [&]() {
    const Tensor starts = randint(0, data.numel() - o.context - 1, {o.batch, 1}, {.device = device});
    const Tensor where = (starts + offsets).reshape({-1});
    return std::pair{index_select(data, 0, where).reshape({o.batch, o.context}),
                     index_select(data, 0, where + 1).reshape({o.batch, o.context})};
  };
  // The step: captured after two eager steps when `graphs` (StepGraph clears the gradients before each step).
  StepGraph step_graph(
      model.parameters(),
      [&](const Tensor& inputs, const Tensor& targets) {
        Tensor l = nn::functional::cross_entropy(model(inputs).reshape({-1, vocab}), targets.reshape({-1}));
        l.backward();
        nn::utils::clip_grad_norm_(model.parameters(), 1.0);
        adamw.step();
        return l.detach();
      },
      {.enabled = graphs});
  Ledger::global().set_budget({.max_syncs = 1, .max_host_to_device_bytes = 0});  // inside a step (see train_mlp)
  // The steps timed for --json: those after three warm-up steps (the first GEMMs' handles, the allocator's first
  // blocks), from a host sync before the first of them to one after the last, outside any step (without --json,
  // neither sync is made).
  const std::int64_t untimed = std::min<std::int64_t>(3, o.steps - 1);
  std::chrono::steady_clock::time_point timed_from;
  Tensor loss;
  for (std::int64_t step = 0; step < o.steps; ++step) {
    if (o.json && step == untimed) {
      synchronize(device, "timing");
      timed_from = std::chrono::steady_clock::now();
    }
    Step scope(step);
    {
      Phase compute(PhaseKind::Compute, device);
      const auto [inputs, targets] = batch();
      loss = step_graph.run(inputs, targets);  // the graph's own loss when replayed: read before the next step
      schedule.step();
    }
    if ((step + 1) % o.log_every == 0 || step == 0) {
      Phase sync(PhaseKind::Sync, device, "log");
      say << "  step " << step + 1 << "  loss " << loss.item<double>() << "  lr " << schedule.last_lr() << "\n";
    }
  }
  Ledger::global().set_budget({});
  if (o.json) synchronize(device, "timing");
  const double seconds_per_step =
      std::chrono::duration<double>(std::chrono::steady_clock::now() - timed_from).count() /
      static_cast<double>(o.steps - untimed);

  // Sampling, on the device: the last --context tokens in, the next one drawn from the softmax of its logits by
  // multinomial (ferry's generator, no host read), appended; the text crosses to the host once, at the end.
  model.eval();
  autograd::NoGradGuard no_grad;
  const std::int64_t newline = id[static_cast<unsigned char>('\n')];
  Tensor generated = full({1, 1}, static_cast<double>(newline >= 0 ? newline : 0),  // as after a line break
                          {.device = device, .dtype = DType::Int64});
  const std::int64_t syncs_before = Ledger::global().totals().syncs;
  for (std::int64_t i = 0; i < o.sample; ++i) {
    const std::int64_t length = generated.size(1), n = std::min(length, o.context);
    const Tensor logits = model(generated.narrow(1, length - n, n)).select(1, n - 1);  // (1, vocab)
    generated = cat({generated, multinomial(softmax(logits, -1), 1)}, 1);
  }
  std::string out;
  for (const std::int64_t next : generated.narrow(1, 1, o.sample).to_vector<std::int64_t>())
    out += chars[static_cast<std::size_t>(next)];
  const std::int64_t sample_syncs = Ledger::global().totals().syncs - syncs_before;
  if (o.sample > 0) {
    say << "\nsample (" << o.sample << " characters, " << sample_syncs << " host sync"
        << (sample_syncs == 1 ? "" : "s") << "):\n" << out << "\n";
  }
  if (graphs) say << "step graph: " << step_graph.describe() << "\n";
  say << "\n" << report_text(make_report({.warmup_steps = 2})) << "\n";
  if (o.json) {
    std::cout.precision(9);
    std::cout << "{\"library\": \"ferry\", \"model\": \"" << o.model << "\", \"device\": \"" << device.str()
              << "\", \"steps\": " << o.steps << ", \"timed_steps\": " << o.steps - untimed
              << ", \"seconds_per_step\": " << seconds_per_step << ", \"final_loss\": " << loss.item<double>()
              << ", \"graph_replays\": " << step_graph.replays() << "}\n";
  }
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  return example::guarded_main("char_transformer", [&] { return run(parse(argc, argv)); });
}
