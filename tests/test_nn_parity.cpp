// test_nn_parity.cpp — ferry's layers, losses and a 10-step SGD run of the `cnn` workload against PyTorch
// fixtures (tools/make_fixtures.py), on cpu and on sim:0. Relative error = max |ferry - torch| / max |torch|.
// Not here: finite-difference checks (test_nn_gradcheck.cpp), optimizer parity (test_optim.cpp).
#include <gtest/gtest.h>

#include <cstring>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <sstream>
#include <string>

#include "fixtures/fixture_reader.h"
#include "test_helpers.h"
#include "ferry/factories.h"
#include "ferry/nn/activation.h"
#include "ferry/nn/attention.h"
#include "ferry/nn/batchnorm.h"
#include "ferry/nn/conv.h"
#include "ferry/nn/distance.h"
#include "ferry/nn/embedding.h"
#include "ferry/nn/groupnorm.h"
#include "ferry/nn/layernorm.h"
#include "ferry/nn/linear.h"
#include "ferry/nn/loss.h"
#include "ferry/nn/pixel_shuffle.h"
#include "ferry/nn/pooling.h"
#include "ferry/nn/rnn.h"
#include "ferry/nn/transformer.h"
#include "ferry/nn/sequential.h"
#include "ferry/ops.h"
#include "ferry/optim.h"

using ferry::Device;
using ferry::Tensor;
using ferry::testing::Fixture;
using ferry::testing::load_fixture;
namespace nn = ferry::nn;

namespace {

constexpr double kLayerTolerance = 1e-4;  // outputs and gradients of one layer
constexpr double kTrainingTolerance = 1e-3;  // parameters after 10 SGD steps

std::shared_ptr<nn::Module> make_layer(const std::string& name, const Fixture& f) {
  auto n = [&](const char* key) { return static_cast<std::int64_t>(f.number(key)); };
  if (name.rfind("linear", 0) == 0) return std::make_shared<nn::Linear>(n("in"), n("out"), f.text("bias", "1") == "1");
  if (name.rfind("conv2d", 0) == 0) {
    return std::make_shared<nn::Conv2d>(n("in"), n("out"), nn::Size2{n("kh"), n("kw")},
                                        nn::Conv2dOptions{.stride = {n("sh"), n("sw")}, .padding = {n("ph"), n("pw")},
                                                          .dilation = {n("dh"), n("dw")},
                                                          .groups = std::stoll(f.text("groups", "1")),
                                                          .bias = n("bias") == 1});
  }
  if (name.rfind("convtranspose2d", 0) == 0) {
    return std::make_shared<nn::ConvTranspose2d>(
        n("in"), n("out"), nn::Size2{n("kh"), n("kw")},
        nn::ConvTranspose2dOptions{.stride = {n("sh"), n("sw")}, .padding = {n("ph"), n("pw")},
                                   .output_padding = {n("oph"), n("opw")}, .groups = n("groups"),
                                   .bias = n("bias") == 1, .dilation = {n("dh"), n("dw")}});
  }
  if (name.rfind("convtranspose1d", 0) == 0) {
    return std::make_shared<nn::ConvTranspose1d>(
        n("in"), n("out"), n("k"),
        nn::ConvTranspose1dOptions{.stride = n("s"), .padding = n("p"), .output_padding = n("op"),
                                   .groups = n("groups"), .bias = n("bias") == 1, .dilation = n("d")});
  }
  if (name.rfind("conv1d", 0) == 0) {
    return std::make_shared<nn::Conv1d>(n("in"), n("out"), n("k"),
                                        nn::Conv1dOptions{.stride = n("s"), .padding = n("p"), .dilation = n("d"),
                                                          .groups = n("groups"), .bias = n("bias") == 1});
  }
  if (name.rfind("upsample", 0) == 0) {
    return std::make_shared<nn::Upsample>(nn::Size2{n("sh"), n("sw")}, f.text("mode", "nearest"),
                                          f.text("align", "0") == "1");
  }
  if (name.rfind("batchnorm", 0) == 0) {
    nn::BatchNormOptions options;
    if (f.text("momentum") == "None") options.momentum = std::nullopt;
    else options.momentum = f.number("momentum");
    if (n("dims") == 1) return std::make_shared<nn::BatchNorm1d>(n("features"), options);
    return std::make_shared<nn::BatchNorm2d>(n("features"), options);
  }
  if (name == "relu") return std::make_shared<nn::ReLU>();
  if (name.rfind("gelu", 0) == 0) return std::make_shared<nn::GELU>(f.text("approximate"));
  if (name == "silu") return std::make_shared<nn::SiLU>();
  if (name == "sigmoid") return std::make_shared<nn::Sigmoid>();
  if (name == "tanh") return std::make_shared<nn::Tanh>();
  if (name == "leaky_relu") return std::make_shared<nn::LeakyReLU>(f.number("slope"));
  if (name == "softplus") return std::make_shared<nn::Softplus>(f.number("beta"), f.number("threshold"));
  if (name.rfind("layernorm", 0) == 0) {
    ferry::Shape shape;
    std::stringstream dims(f.text("shape"));
    for (std::string d; std::getline(dims, d, ',');) shape.push_back(std::stoll(d));
    return std::make_shared<nn::LayerNorm>(shape, f.number("eps"), n("affine") == 1);
  }
  if (name.rfind("groupnorm", 0) == 0) {
    return std::make_shared<nn::GroupNorm>(n("groups"), n("channels"), f.number("eps"), n("affine") == 1);
  }
  if (name == "flatten") return std::make_shared<nn::Flatten>();
  if (name.rfind("maxpool2d", 0) == 0) return std::make_shared<nn::MaxPool2d>(n("k"), n("s"), n("p"));
  if (name.rfind("avgpool2d", 0) == 0) return std::make_shared<nn::AvgPool2d>(n("k"), n("s"), n("p"));
  if (name.rfind("adaptive_avgpool2d", 0) == 0) {
    return std::make_shared<nn::AdaptiveAvgPool2d>(nn::Size2{n("oh"), n("ow")});
  }
  if (name.rfind("adaptive_maxpool2d", 0) == 0) {
    return std::make_shared<nn::AdaptiveMaxPool2d>(nn::Size2{n("oh"), n("ow")});
  }
  if (name.rfind("pixel_shuffle", 0) == 0) return std::make_shared<nn::PixelShuffle>(n("r"));
  if (name.rfind("pixel_unshuffle", 0) == 0) return std::make_shared<nn::PixelUnshuffle>(n("r"));
  throw std::runtime_error("no layer for fixture " + name);
}

// Entries "prefix.<name>" of a fixture as a state dict with "<name>" keys.
nn::NamedTensors with_prefix(const Fixture& f, const std::string& prefix) {
  nn::NamedTensors out;
  for (const auto& [key, value] : f.tensors) {
    if (key.rfind(prefix, 0) == 0) out.emplace_back(key.substr(prefix.size()), value);
  }
  return out;
}

struct LayerRun {
  std::vector<std::vector<double>> values;  // every result, to compare devices
};

LayerRun check_layer(const std::string& name, Device device) {
  const Fixture f = load_fixture(name);
  auto layer = make_layer(name, f);
  layer->to(device);
  layer->load_state_dict(with_prefix(f, "param."));
  layer->train(f.number("train") == 1);
  Tensor x = f["input"].to(device).requires_grad_(true);
  Tensor out;
  for (int step = 0; step < static_cast<int>(f.number("steps")); ++step) out = layer->forward(x);
  out.backward(f["grad_output"].to(device));
  const std::string where = name + " on " + device.str();
  LayerRun run;
  EXPECT_EQ(out.device(), device) << where;
  EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
  EXPECT_CLOSE_TO_FIXTURE(x.grad(), f["grad_input"], kLayerTolerance, where + ": grad_input");
  run.values.push_back(out.to_vector<double>());
  run.values.push_back(x.grad().to_vector<double>());
  for (const auto& [pname, p] : layer->named_parameters()) {
    EXPECT_CLOSE_TO_FIXTURE(p.grad(), f["grad." + pname], kLayerTolerance, where + ": grad of " + pname);
    run.values.push_back(p.grad().to_vector<double>());
  }
  for (const auto& [key, value] : layer->state_dict()) {  // running statistics after the steps
    EXPECT_CLOSE_TO_FIXTURE(value, f["after." + key], kLayerTolerance, where + ": " + key + " after");
    run.values.push_back(value.to_vector<double>());
  }
  return run;
}

}  // namespace

class NNParityLayer : public ::testing::TestWithParam<std::string> {};

bool have_cuda() { return ferry::is_available(ferry::DeviceType::CUDA); }
const Device kCuda0(ferry::DeviceType::CUDA, 0);

TEST_P(NNParityLayer, MatchesPyTorchOnCpuAndSim) {
  const LayerRun cpu = check_layer(GetParam(), ferry::kCPU);
  const LayerRun sim = check_layer(GetParam(), Device::parse("sim:0"));
  EXPECT_EQ(cpu.values, sim.values) << GetParam() << ": sim:0 differs from cpu";
  if (have_cuda()) check_layer(GetParam(), kCuda0);  // against the fixture's tolerance only
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParityLayer,
                         ::testing::Values("linear", "linear_3d_nobias", "conv2d_pad1", "conv2d_strided_dilated",
                                           "conv2d_nobias_s2_d2", "conv2d_pointwise", "conv2d_groups2",
                                           "conv2d_depthwise", "conv1d_groups2", "convtranspose2d_k3s2p1op1",
                                           "convtranspose2d_groups2_dilated", "convtranspose2d_op_past_stride",
                                           "convtranspose1d_s2", "upsample_nearest_2x3", "upsample_bilinear_2x",
                                           "upsample_bilinear_align_3x2",
                                           "batchnorm2d_train",
                                           "batchnorm2d_eval", "batchnorm1d_train_2d", "batchnorm1d_train_3d",
                                           "batchnorm1d_cumulative", "relu", "maxpool2d_k2", "maxpool2d_k3s2p1",
                                           "avgpool2d_k2", "avgpool2d_k3s2p1", "adaptive_avgpool2d_5x3",
                                           "adaptive_avgpool2d_1", "adaptive_avgpool2d_2x4", "adaptive_maxpool2d_5x3",
                                           "adaptive_maxpool2d_3x4_up", "adaptive_maxpool2d_2x4", "flatten", "gelu",
                                           "gelu_tanh",
                                           "silu", "sigmoid", "tanh", "leaky_relu", "softplus", "layernorm_last",
                                           "layernorm_last2", "layernorm_noaffine", "groupnorm_2of6",
                                           "groupnorm_3of3_noaffine_1d", "pixel_shuffle_3", "pixel_unshuffle_2",
                                           "pixel_shuffle_2_5d"));

// Embedding against torch 1.13: the looked-up rows, and the weight's gradient, where repeated indices add up and
// the padding row (padding_idx -2 of 8) gets none; on cpu, sim:0 (bit for bit the cpu's) and cuda:0 where present.
TEST(NNParityEmbedding, LookupAndGradientMatchPyTorch) {
  for (const std::string name : {"embedding", "embedding_padding"}) {
    const Fixture f = load_fixture(name);
    const std::string pad = f.text("padding_idx");
    std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
    if (have_cuda()) devices.push_back(kCuda0);
    std::vector<std::vector<double>> first;
    for (const Device device : devices) {
      nn::Embedding layer(static_cast<std::int64_t>(f.number("num")), static_cast<std::int64_t>(f.number("dim")),
                          pad == "None" ? std::nullopt : std::optional<std::int64_t>(std::stoll(pad)));
      layer.to(device);
      layer.load_state_dict(with_prefix(f, "param."));
      Tensor out = layer(f["indices"].to(device));
      out.backward(f["grad_output"].to(device));
      const std::string where = name + " on " + device.str();
      EXPECT_CLOSE_TO_FIXTURE(out, f["output"], 0, where + ": output");
      EXPECT_CLOSE_TO_FIXTURE(layer.weight.grad(), f["grad.weight"], kLayerTolerance, where + ": grad of weight");
      const std::vector<std::vector<double>> values = {out.to_vector<double>(),
                                                       layer.weight.grad().to_vector<double>()};
      if (first.empty()) {
        first = values;
      } else if (!device.is_cuda()) {
        EXPECT_EQ(values, first) << where << " differs from cpu";
      }
    }
  }
}

namespace {
// Every parameter's gradient against the fixture's "grad.<name>" (the fixture has one per parameter, no more),
// appended to `values`.
void expect_parameter_grads(const nn::Module& module, const Fixture& f, const std::string& where,
                            std::vector<std::vector<double>>& values) {
  EXPECT_EQ(module.named_parameters().size(), with_prefix(f, "grad.").size()) << where;
  for (const auto& [name, p] : module.named_parameters()) {
    EXPECT_CLOSE_TO_FIXTURE(p.grad(), f["grad." + name], kLayerTolerance, where + ": grad of " + name);
    values.push_back(p.grad().to_vector<double>());
  }
}

// The first device's (the cpu's) values are kept; a later host device (sim) must give them bit for bit, cuda only
// within the fixture's tolerance.
void expect_first_devices_bits(std::vector<std::vector<double>>& first, const std::vector<std::vector<double>>& values,
                               Device device, const std::string& where) {
  if (first.empty()) {
    first = values;
  } else if (!device.is_cuda()) {
    EXPECT_EQ(values, first) << where << " differs from cpu";
  }
}
}  // namespace

// RNN, LSTM and GRU against torch 1.13: several layers, bidirectional, batch_first, unbatched, without bias, with
// and without initial states. The output and final states, and the gradients of the input, the initial states and
// every parameter (backpropagation through time); on cpu, sim:0 (the cpu's bits) and cuda:0 where present.
TEST(NNParityRecurrent, RnnLstmAndGruMatchPyTorch) {
  for (const std::string name : {"lstm_2layer_bidirectional", "gru_1layer", "gru_bidirectional_nobias_unbatched",
                                 "rnn_relu_2layer", "rnn_tanh"}) {
    const Fixture f = load_fixture(name);
    auto n = [&](const char* key) { return static_cast<std::int64_t>(f.number(key)); };
    const nn::RNNOptions options{.num_layers = n("layers"), .bias = n("bias") == 1, .batch_first = n("batch_first") == 1,
                                 .bidirectional = n("bidirectional") == 1};
    const std::string cell = f.text("cell");
    const bool lstm = cell == "lstm";
    std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
    if (have_cuda()) devices.push_back(kCuda0);
    std::vector<std::vector<double>> first;
    for (const Device device : devices) {
      const std::string where = name + " on " + device.str();
      std::shared_ptr<nn::RNNBase> layer;
      if (lstm) layer = std::make_shared<nn::LSTM>(n("input_size"), n("hidden"), options);
      else if (cell == "gru") layer = std::make_shared<nn::GRU>(n("input_size"), n("hidden"), options);
      else layer = std::make_shared<nn::RNN>(n("input_size"), n("hidden"), options, cell);
      layer->to(device);
      layer->load_state_dict(with_prefix(f, "param."));
      Tensor x = f["input"].detach().to(device).requires_grad_(true);
      const bool with_state = n("with_state") == 1;
      Tensor h0 = with_state ? f["h0"].detach().to(device).requires_grad_(true) : Tensor();
      Tensor c0 = with_state && lstm ? f["c0"].detach().to(device).requires_grad_(true) : Tensor();
      const nn::RNNOutput r = layer->forward(x, h0, c0);
      Tensor loss = ferry::add(ferry::sum(ferry::mul(r.output, f["grad_output"].to(device))),
                               ferry::sum(ferry::mul(r.h_n, f["grad_h_n"].to(device))));
      if (lstm) loss = ferry::add(loss, ferry::sum(ferry::mul(r.c_n, f["grad_c_n"].to(device))));
      loss.backward();
      EXPECT_CLOSE_TO_FIXTURE(r.output, f["output"], kLayerTolerance, where + ": output");
      EXPECT_CLOSE_TO_FIXTURE(r.h_n, f["h_n"], kLayerTolerance, where + ": h_n");
      EXPECT_CLOSE_TO_FIXTURE(x.grad(), f["grad_input"], kLayerTolerance, where + ": grad_input");
      std::vector<std::vector<double>> values = {r.output.to_vector<double>(), r.h_n.to_vector<double>(),
                                                 x.grad().to_vector<double>()};
      if (lstm) {
        EXPECT_CLOSE_TO_FIXTURE(r.c_n, f["c_n"], kLayerTolerance, where + ": c_n");
        values.push_back(r.c_n.to_vector<double>());
      } else {
        EXPECT_FALSE(r.c_n.defined()) << where;
      }
      if (with_state) {
        EXPECT_CLOSE_TO_FIXTURE(h0.grad(), f["grad_h0"], kLayerTolerance, where + ": grad_h0");
        values.push_back(h0.grad().to_vector<double>());
        if (lstm) EXPECT_CLOSE_TO_FIXTURE(c0.grad(), f["grad_c0"], kLayerTolerance, where + ": grad_c0");
      }
      expect_parameter_grads(*layer, f, where, values);
      expect_first_devices_bits(first, values, device, where);
    }
  }
}

// TransformerEncoderLayer (post-norm with a key padding mask, batch first; pre-norm with GELU and a causal float
// mask) and a 2-layer TransformerEncoder with a final LayerNorm and both masks, against torch 1.13 in training mode
// (dropout 0). The output and the gradients of the input and of every parameter, by PyTorch's names; on cpu, sim:0
// (the cpu's bits) and cuda:0 where present.
TEST(NNParityTransformer, EncoderLayersMatchPyTorch) {
  for (const std::string name :
       {"encoder_layer_post_norm_padding", "encoder_layer_pre_norm_gelu_causal", "encoder_2layers_final_norm"}) {
    const Fixture f = load_fixture(name);
    auto n = [&](const char* key) { return static_cast<std::int64_t>(f.number(key)); };
    const nn::TransformerEncoderLayerOptions options{.dim_feedforward = n("ff"), .dropout = 0.0,
                                                     .activation = f.text("activation"),
                                                     .batch_first = n("batch_first") == 1,
                                                     .norm_first = n("norm_first") == 1};
    std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
    if (have_cuda()) devices.push_back(kCuda0);
    std::vector<std::vector<double>> first;
    for (const Device device : devices) {
      const std::string where = name + " on " + device.str();
      std::shared_ptr<nn::Module> encoder;
      if (n("layers") == 0) {
        encoder = std::make_shared<nn::TransformerEncoderLayer>(n("d_model"), n("nhead"), options);
      } else {
        encoder = std::make_shared<nn::TransformerEncoder>(n("d_model"), n("nhead"), n("layers"), options,
                                                           n("final_norm") == 1);
      }
      encoder->to(device);
      encoder->load_state_dict(with_prefix(f, "param."));  // strict: every PyTorch name, no other
      nn::EncoderMasks masks;
      if (f.has("mask")) masks.mask = f["mask"].to(device);
      if (f.has("src_key_padding_mask")) masks.src_key_padding_mask = f["src_key_padding_mask"].to(device);
      Tensor x = f["input"].detach().to(device).requires_grad_(true);
      const Tensor out = n("layers") == 0 ? static_cast<nn::TransformerEncoderLayer&>(*encoder).forward(x, masks)
                                          : static_cast<nn::TransformerEncoder&>(*encoder).forward(x, masks);
      out.backward(f["grad_output"].to(device));
      EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
      EXPECT_CLOSE_TO_FIXTURE(x.grad(), f["grad_input"], kLayerTolerance, where + ": grad_input");
      std::vector<std::vector<double>> values = {out.to_vector<double>(), x.grad().to_vector<double>()};
      expect_parameter_grads(*encoder, f, where, values);
      expect_first_devices_bits(first, values, device, where);
    }
  }
}

// TransformerDecoderLayer (post-norm, batch first, with a causal target mask and both key padding masks; pre-norm
// GELU with a float memory mask), a 2-layer TransformerDecoder with a final LayerNorm, and a whole nn::Transformer
// (1 encoder layer, 2 decoder layers, batch first) against torch 1.13 in training mode (dropout 0): the output and
// the gradients of the target, the memory (a Transformer's src) and every parameter, by PyTorch's names; on cpu,
// sim:0 (the cpu's bits) and cuda:0 where present.
TEST(NNParityTransformer, DecoderLayersAndTransformerMatchPyTorch) {
  for (const std::string name : {"decoder_layer_post_norm_masks", "decoder_layer_pre_norm_gelu_memory_mask",
                                 "decoder_2layers_final_norm", "transformer_1enc_2dec"}) {
    const Fixture f = load_fixture(name);
    auto n = [&](const char* key) { return static_cast<std::int64_t>(f.number(key)); };
    const nn::TransformerDecoderLayerOptions options{.dim_feedforward = n("ff"), .dropout = 0.0,
                                                     .activation = f.text("activation"),
                                                     .batch_first = n("batch_first") == 1,
                                                     .norm_first = n("norm_first") == 1};
    std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
    if (have_cuda()) devices.push_back(kCuda0);
    std::vector<std::vector<double>> first;
    for (const Device device : devices) {
      const std::string where = name + " on " + device.str();
      auto mask = [&](const std::string& key) { return f.has("mask." + key) ? f["mask." + key].to(device) : Tensor(); };
      Tensor tgt = f["tgt"].detach().to(device).requires_grad_(true);
      Tensor memory = f["memory"].detach().to(device).requires_grad_(true);
      const nn::DecoderMasks masks{.tgt_mask = mask("tgt_mask"),
                                   .memory_mask = mask("memory_mask"),
                                   .tgt_key_padding_mask = mask("tgt_key_padding_mask"),
                                   .memory_key_padding_mask = mask("memory_key_padding_mask")};
      std::shared_ptr<nn::Module> module;
      Tensor out;
      if (n("transformer") == 1) {
        auto transformer = std::make_shared<nn::Transformer>(nn::TransformerOptions{
            .d_model = n("d_model"), .nhead = n("nhead"), .num_encoder_layers = n("encoder_layers"),
            .num_decoder_layers = n("decoder_layers"), .layer = options});
        module = transformer;
        module->to(device);
        module->load_state_dict(with_prefix(f, "param."));  // strict: every PyTorch name, no other
        out = transformer->forward(memory, tgt,
                                   {.tgt_mask = masks.tgt_mask,
                                    .src_key_padding_mask = mask("src_key_padding_mask"),
                                    .tgt_key_padding_mask = masks.tgt_key_padding_mask,
                                    .memory_key_padding_mask = masks.memory_key_padding_mask});
      } else if (n("layers") == 0) {
        auto layer = std::make_shared<nn::TransformerDecoderLayer>(n("d_model"), n("nhead"), options);
        module = layer;
        module->to(device);
        module->load_state_dict(with_prefix(f, "param."));
        out = layer->forward(tgt, memory, masks);
      } else {
        auto decoder = std::make_shared<nn::TransformerDecoder>(n("d_model"), n("nhead"), n("layers"), options,
                                                                n("final_norm") == 1);
        module = decoder;
        module->to(device);
        module->load_state_dict(with_prefix(f, "param."));
        out = decoder->forward(tgt, memory, masks);
      }
      out.backward(f["grad_output"].to(device));
      EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
      EXPECT_CLOSE_TO_FIXTURE(tgt.grad(), f["grad_tgt"], kLayerTolerance, where + ": grad_tgt");
      EXPECT_CLOSE_TO_FIXTURE(memory.grad(), f["grad_memory"], kLayerTolerance, where + ": grad_memory");
      std::vector<std::vector<double>> values = {out.to_vector<double>(), tgt.grad().to_vector<double>(),
                                                 memory.grad().to_vector<double>()};
      expect_parameter_grads(*module, f, where, values);
      expect_first_devices_bits(first, values, device, where);
    }
  }
}

// MultiheadAttention against torch 1.13's nn.MultiheadAttention: self-attention, batch first, causal (ferry's is_causal
// against torch's triu mask); and cross-attention, sequence first, with a key padding mask, a float attn_mask and
// per-head weights. The output, the weights, and the gradients of every input and parameter; on cpu, sim:0 (the cpu's
// bits) and cuda:0 where present.
TEST(NNParityAttention, MultiheadAttentionMatchesPyTorch) {
  for (const std::string name : {"mha_self_causal", "mha_cross_padding"}) {
    const Fixture f = load_fixture(name);
    std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
    if (have_cuda()) devices.push_back(kCuda0);
    std::vector<std::vector<double>> first;
    for (const Device device : devices) {
      const std::string where = name + " on " + device.str();
      nn::MultiheadAttention mha(static_cast<std::int64_t>(f.number("embed_dim")),
                                 static_cast<std::int64_t>(f.number("heads")),
                                 {.batch_first = f.number("batch_first") == 1});
      mha.to(device);
      mha.load_state_dict(with_prefix(f, "param."));
      const bool self = f.number("self") == 1;
      Tensor query = f["query"].detach().to(device).requires_grad_(true);  // detached: a leaf on every device
      Tensor key = self ? query : f["key"].detach().to(device).requires_grad_(true);
      Tensor value = self ? query : f["value"].detach().to(device).requires_grad_(true);
      nn::AttendOptions how;
      how.is_causal = f.number("causal") == 1;
      how.average_attn_weights = f.number("average") == 1;
      if (f.has("attn_mask")) how.attn_mask = f["attn_mask"].to(device);
      if (f.has("key_padding_mask")) how.key_padding_mask = f["key_padding_mask"].to(device);
      const nn::AttentionResult r = mha.attend(query, key, value, how);
      r.output.backward(f["grad_output"].to(device));
      EXPECT_CLOSE_TO_FIXTURE(r.output, f["output"], kLayerTolerance, where + ": output");
      EXPECT_CLOSE_TO_FIXTURE(r.weights, f["weights"], kLayerTolerance, where + ": weights");
      std::vector<std::vector<double>> values = {r.output.to_vector<double>(), r.weights.to_vector<double>()};
      for (const auto& [input, label] :
           {std::pair{&query, "query"}, std::pair{&key, "key"}, std::pair{&value, "value"}}) {
        if (self && input != &query) continue;
        EXPECT_CLOSE_TO_FIXTURE(input->grad(), f[std::string("grad.") + label], kLayerTolerance,
                                where + ": grad of " + label);
        values.push_back(input->grad().to_vector<double>());
      }
      for (const auto& [pname, p] : mha.named_parameters()) {
        EXPECT_CLOSE_TO_FIXTURE(p.grad(), f["grad.param." + pname], kLayerTolerance, where + ": grad of " + pname);
        values.push_back(p.grad().to_vector<double>());
      }
      if (first.empty()) {
        first = values;
      } else if (!device.is_cuda()) {
        EXPECT_EQ(values, first) << where << " differs from cpu";
      }
    }
  }
}

// scaled_dot_product_attention against PyTorch 2's formula written out in torch 1.13 (a bool mask, true = may
// attend): output and the gradients of query, key and value, batched over two leading dims.
TEST(NNParityAttention, ScaledDotProductAttentionMatchesPyTorch) {
  const Fixture f = load_fixture("sdpa_bool_mask");
  std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
  if (have_cuda()) devices.push_back(kCuda0);
  for (const Device device : devices) {
    const std::string where = "sdpa on " + device.str();
    Tensor q = f["query"].detach().to(device).requires_grad_(true),  // detached: a leaf on every device
        k = f["key"].detach().to(device).requires_grad_(true), v = f["value"].detach().to(device).requires_grad_(true);
    const Tensor out = nn::functional::scaled_dot_product_attention(q, k, v, f["mask"].to(device));
    out.backward(f["grad_output"].to(device));
    EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
    EXPECT_CLOSE_TO_FIXTURE(q.grad(), f["grad.query"], kLayerTolerance, where + ": grad of query");
    EXPECT_CLOSE_TO_FIXTURE(k.grad(), f["grad.key"], kLayerTolerance, where + ": grad of key");
    EXPECT_CLOSE_TO_FIXTURE(v.grad(), f["grad.value"], kLayerTolerance, where + ": grad of value");
  }
  // is_causal equals the explicit lower-triangle mask; bad shapes and both masks at once are refused.
  const Tensor q = f["query"], k = f["key"].narrow(2, 0, 4), v = f["value"].narrow(2, 0, 4);
  const Tensor lower = ge(ferry::arange(4).unsqueeze(1), ferry::arange(4).unsqueeze(0));
  EXPECT_TRUE(ferry::testing::all_close(nn::functional::scaled_dot_product_attention(q, k, v, Tensor(), 0, true),
                                        nn::functional::scaled_dot_product_attention(q, k, v, lower), 0, 0));
  EXPECT_THROW(nn::functional::scaled_dot_product_attention(q, k, v, lower, 0, true), ferry::InvalidArgument);
  EXPECT_THROW(nn::functional::scaled_dot_product_attention(q, f["value"], v), ferry::ShapeMismatch);
  EXPECT_THROW(nn::MultiheadAttention(10, 3), ferry::InvalidArgument);
}

namespace {
nn::Reduction reduction_of(const Fixture& f) {
  const std::string name = f.text("reduction");
  return name == "mean" ? nn::Reduction::Mean : name == "sum" ? nn::Reduction::Sum : nn::Reduction::None;
}

// An input-only function of a fixture (a loss, softmax, ...) on cpu, sim:0 (and cuda:0 where present): `run` gets
// the fixture's input on the device, with requires_grad, and returns the output. The output and the input's
// gradient (for grad_output) must be within the layer tolerance of PyTorch's, and cpu and sim:0 equal to the bit.
void check_function_against_fixture(const std::string& name,
                                    const std::function<Tensor(const Fixture&, const Tensor&, Device)>& run) {
  const Fixture f = load_fixture(name);
  std::vector<std::vector<double>> results;
  std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
  if (have_cuda()) devices.push_back(kCuda0);
  for (const Device device : devices) {
    const std::string where = name + " on " + device.str();
    Tensor x = f["input"].detach().to(device).requires_grad_(true);
    Tensor out = run(f, x, device);
    ASSERT_EQ(out.shape(), f["output"].shape()) << where;
    out.backward(f["grad_output"].to(device));
    EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
    EXPECT_CLOSE_TO_FIXTURE(x.grad(), f["grad_input"], kLayerTolerance, where + ": grad_input");
    results.push_back(out.to_vector<double>());
    results.push_back(x.grad().to_vector<double>());
  }
  EXPECT_EQ(results[0], results[2]) << name << ": sim:0 output differs from cpu";
  EXPECT_EQ(results[1], results[3]) << name << ": sim:0 gradient differs from cpu";
}
}  // namespace

class NNParityLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(NNParityLoss, MatchesPyTorchOnCpuAndSim) {
  check_function_against_fixture(GetParam(), [](const Fixture& f, const Tensor& x, Device device) {
    const Tensor target = f["target"].to(device);
    return f.text("kind") == "cross_entropy" ? nn::functional::cross_entropy(x, target, reduction_of(f))
                                             : nn::functional::mse_loss(x, target, reduction_of(f));
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParityLoss,
                         ::testing::Values("cross_entropy_mean", "cross_entropy_sum", "cross_entropy_none", "mse_mean",
                                           "mse_sum", "mse_none"));

// l1, smooth_l1 (beta 0.5 and 0), huber, binary_cross_entropy (with a per-class weight) and its logits form (with
// weight and pos_weight) against PyTorch, in each reduction; cpu and sim:0 agree to the bit.
class NNParityElementwiseLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(NNParityElementwiseLoss, MatchesPyTorchOnCpuAndSim) {
  check_function_against_fixture(GetParam(), [](const Fixture& f, const Tensor& x, Device device) {
    const Tensor target = f["target"].to(device);
    const std::string kind = f.text("kind");
    const Tensor weight = f.has("weight") ? f["weight"].to(device) : Tensor();
    if (kind == "l1") return nn::functional::l1_loss(x, target, reduction_of(f));
    if (kind == "smooth_l1") return nn::functional::smooth_l1_loss(x, target, reduction_of(f), f.number("beta"));
    if (kind == "huber") {
      return nn::functional::huber_loss(x, target, reduction_of(f), std::stod(f.text("delta", "1")));
    }
    if (kind == "bce") return nn::functional::binary_cross_entropy(x, target, {reduction_of(f), weight});
    return nn::functional::binary_cross_entropy_with_logits(
        x, target, {reduction_of(f), weight, f.has("pos_weight") ? f["pos_weight"].to(device) : Tensor()});
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParityElementwiseLoss,
                         ::testing::Values("l1_mean", "l1_sum", "l1_none", "bce_weight_mean", "bce_weight_sum",
                                           "bce_weight_none", "bce_logits_pos_weight_mean", "bce_logits_pos_weight_sum",
                                           "bce_logits_pos_weight_none", "smooth_l1_beta_half_mean",
                                           "smooth_l1_beta0_sum", "huber_delta2_mean", "huber_none", "bce_mean",
                                           "bce_logits_mean"));

// Functions of several differentiable inputs against PyTorch: normalize (p 2 with a zero vector, 1 and 3),
// cosine_similarity (broadcast too), pairwise_distance, kl_div in every reduction and with log targets,
// cosine_embedding_loss and triplet_margin_loss (p 1 with swap). The output and every input's gradient; on cpu,
// sim:0 (the cpu's bits) and cuda:0 where present.
class NNParityFunction : public ::testing::TestWithParam<std::string> {};

TEST_P(NNParityFunction, MatchesPyTorch) {
  const Fixture f = load_fixture(GetParam());
  auto number = [&](const char* key, const char* fallback) { return std::stod(f.text(key, fallback)); };
  auto reduction = [&] {
    const std::string name = f.text("reduction", "mean");
    return name == "mean" ? nn::Reduction::Mean : name == "sum" ? nn::Reduction::Sum : nn::Reduction::None;
  };
  const std::string kind = f.text("kind");
  const int count = static_cast<int>(f.number("inputs"));
  std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
  if (have_cuda()) devices.push_back(kCuda0);
  std::vector<std::vector<double>> first;
  for (const Device device : devices) {
    const std::string where = GetParam() + " on " + device.str();
    std::vector<Tensor> in;
    for (int i = 0; i < count; ++i) in.push_back(f["in" + std::to_string(i)].detach().to(device).requires_grad_(true));
    const Tensor target = f.has("target") ? f["target"].to(device) : Tensor();
    const int dim = static_cast<int>(number("dim", "1"));
    Tensor out;
    if (kind == "normalize") {
      out = nn::functional::normalize(in[0], number("p", "2"), dim, number("eps", "1e-12"));
    } else if (kind == "cosine_similarity") {
      out = nn::CosineSimilarity(dim).forward(in[0], in[1]);
    } else if (kind == "pairwise_distance") {
      out = nn::PairwiseDistance(number("p", "2"), 1e-6, f.text("keepdim", "0") == "1").forward(in[0], in[1]);
    } else if (kind == "kl_div") {
      const std::string name = f.text("reduction");
      const nn::KLDivReduction how = name == "batchmean" ? nn::KLDivReduction::BatchMean
                                     : name == "sum"     ? nn::KLDivReduction::Sum
                                     : name == "mean"    ? nn::KLDivReduction::Mean
                                                         : nn::KLDivReduction::None;
      out = nn::KLDivLoss({.reduction = how, .log_target = f.text("log_target", "0") == "1"})(in[0], target);
    } else if (kind == "cosine_embedding_loss") {
      out = nn::CosineEmbeddingLoss({.margin = number("margin", "0"), .reduction = reduction()})(in[0], in[1], target);
    } else {
      ASSERT_EQ(kind, "triplet_margin_loss");
      out = nn::TripletMarginLoss({.margin = number("margin", "1"), .p = number("p", "2"),
                                   .swap = f.text("swap", "0") == "1", .reduction = reduction()})(in[0], in[1], in[2]);
    }
    ASSERT_EQ(out.shape(), f["output"].shape()) << where;
    out.backward(f["grad_output"].to(device));
    EXPECT_CLOSE_TO_FIXTURE(out, f["output"], kLayerTolerance, where + ": output");
    std::vector<std::vector<double>> values = {out.to_vector<double>()};
    for (int i = 0; i < count; ++i) {
      EXPECT_CLOSE_TO_FIXTURE(in[i].grad(), f["grad_in" + std::to_string(i)], kLayerTolerance,
                              where + ": gradient of input " + std::to_string(i));
      values.push_back(in[i].grad().to_vector<double>());
    }
    expect_first_devices_bits(first, values, device, where);
  }
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParityFunction,
                         ::testing::Values("normalize_p2_dim1", "normalize_p1_last", "normalize_p3_dim0",
                                           "cosine_similarity_dim1", "cosine_similarity_broadcast",
                                           "pairwise_distance_p2", "pairwise_distance_p1_keepdim", "kl_div_batchmean",
                                           "kl_div_sum", "kl_div_mean", "kl_div_none", "kl_div_log_target",
                                           "cosine_embedding_loss_margin", "cosine_embedding_loss_none",
                                           "triplet_margin_loss", "triplet_margin_loss_p1_swap_none"));

// cross_entropy with weight, ignore_index and label smoothing, and nll_loss, against PyTorch; cpu and sim:0 must
// agree to the bit (the same host kernels under both).
class NNParityClassLoss : public ::testing::TestWithParam<std::string> {};

TEST_P(NNParityClassLoss, MatchesPyTorchOnCpuAndSim) {
  check_function_against_fixture(GetParam(), [](const Fixture& f, const Tensor& x, Device device) {
    const Tensor target = f["target"].to(device);
    const Tensor weight = f.has("weight") ? f["weight"].to(device) : Tensor();
    const std::string ignore = f.text("ignore_index");
    const std::optional<std::int64_t> ignore_index =
        ignore == "none" ? std::nullopt : std::optional<std::int64_t>(std::stoll(ignore));
    if (f.text("kind") != "cross_entropy") {
      return nn::functional::nll_loss(
          x, target, {.reduction = reduction_of(f), .weight = weight, .ignore_index = ignore_index});
    }
    return nn::functional::cross_entropy(x, target,
                                         {.reduction = reduction_of(f), .weight = weight,
                                          .ignore_index = ignore_index,
                                          .label_smoothing = f.number("label_smoothing")});
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParityClassLoss,
                         ::testing::Values("ce_weight_mean", "ce_weight_sum", "ce_weight_none",
                                           "ce_smooth_weight_ignore_mean", "ce_smooth_weight_ignore_sum",
                                           "ce_smooth_weight_ignore_none", "nll_weight_ignore_mean",
                                           "nll_weight_ignore_sum", "nll_weight_ignore_none", "ce_ignore_mean",
                                           "ce_ignore_class_mean", "ce_smooth_mean", "ce_smooth_ignore_sum",
                                           "nll_mean"));

// softmax, log_softmax and logsumexp (ferry/ops.h) against PyTorch, including logits of size ~100 that overflow
// exp() unless the maximum is subtracted first.
class NNParitySoftmax : public ::testing::TestWithParam<std::string> {};

TEST_P(NNParitySoftmax, MatchesPyTorchOnCpuAndSim) {
  check_function_against_fixture(GetParam(), [](const Fixture& f, const Tensor& x, Device) {
    const std::string kind = f.text("kind");
    const int dim = static_cast<int>(f.number("dim"));
    return kind == "softmax"       ? ferry::softmax(x, dim)
           : kind == "log_softmax" ? ferry::log_softmax(x, dim)
                                   : ferry::logsumexp(x, dim, f.number("keepdim") == 1);
  });
}

INSTANTIATE_TEST_SUITE_P(Fixtures, NNParitySoftmax,
                         ::testing::Values("softmax_dim1", "softmax_dim0_3d", "softmax_large", "log_softmax_dim1",
                                           "log_softmax_last_3d", "log_softmax_large", "logsumexp_dim1",
                                           "logsumexp_dim0_keepdim", "logsumexp_large"));

namespace {
// DESIGN.md's `cnn` workload: 3 x [Conv3x3 pad 1, BatchNorm2d, ReLU, MaxPool 2] (32, 64, 128), Flatten,
// Linear 2048 -> 10.
nn::Sequential make_cnn() {
  nn::Sequential model;
  const std::int64_t channels[] = {3, 32, 64, 128};
  for (int i = 0; i < 3; ++i) {
    model.push_back(nn::Conv2d(channels[i], channels[i + 1], 3, {.padding = 1}));
    model.push_back(nn::BatchNorm2d(channels[i + 1]));
    model.push_back(nn::ReLU());
    model.push_back(nn::MaxPool2d(2));
  }
  model.push_back(nn::Flatten());
  model.push_back(nn::Linear(2048, 10));
  return model;
}

struct TrainingRun {
  std::vector<double> losses;
  nn::NamedTensors final_state;
  std::vector<double> eval_logits;
};

TrainingRun train_cnn(const Fixture& f, Device device) {
  nn::Sequential model = make_cnn();
  model.load_state_dict(with_prefix(f, "initial."));
  model.to(device);
  ferry::optim::SGD optimizer(model.parameters(), {.lr = f.number("lr"), .momentum = f.number("momentum")});
  const Tensor x = f["input"].to(device), target = f["target"].to(device);
  TrainingRun run;
  model.train();
  for (int step = 0; step < static_cast<int>(f.number("steps")); ++step) {
    optimizer.zero_grad();
    Tensor loss = nn::functional::cross_entropy(model(x), target);
    loss.backward();
    optimizer.step();
    run.losses.push_back(loss.item<double>());
  }
  run.final_state = model.state_dict();
  model.eval();
  run.eval_logits = model(x).to_vector<double>();
  return run;
}
}  // namespace

TEST(NNParityCnn, TenSgdMomentumStepsMatchPyTorch) {
  const Fixture f = load_fixture("cnn_sgd");
  std::vector<TrainingRun> runs;
  std::vector<Device> devices = {ferry::kCPU, Device::parse("sim:0")};
  if (have_cuda()) devices.push_back(kCuda0);  // against the fixture's tolerances only
  for (const Device device : devices) {
    const std::string where = "cnn on " + device.str();
    TrainingRun run = train_cnn(f, device);
    const std::vector<double> expected_losses = f["losses"].to_vector<double>();
    ASSERT_EQ(run.losses.size(), expected_losses.size());
    for (std::size_t i = 0; i < run.losses.size(); ++i) {
      EXPECT_NEAR(run.losses[i], expected_losses[i], 1e-4 * std::abs(expected_losses[i]) * (i + 1))
          << where << ": loss at step " << i;
    }
    ASSERT_EQ(run.final_state.size(), 23u);  // 3 conv + 1 linear: 2 each; 3 BatchNorm: 5 each
    for (const auto& [name, value] : run.final_state) {
      EXPECT_EQ(value.device(), device) << where << ": " << name;
      EXPECT_CLOSE_TO_FIXTURE(value, f["final." + name], kTrainingTolerance, where + ": " + name + " after 10 steps");
    }
    EXPECT_CLOSE_TO_FIXTURE(ferry::from_vector(run.eval_logits, {8, 10}), f["eval_logits"], kTrainingTolerance,
                            where + ": eval-mode logits after training");
    runs.push_back(std::move(run));
  }
  EXPECT_EQ(runs[0].losses, runs[1].losses) << "sim:0 losses differ from cpu";
  EXPECT_EQ(runs[0].eval_logits, runs[1].eval_logits) << "sim:0 eval logits differ from cpu";
  for (std::size_t i = 0; i < runs[0].final_state.size(); ++i) {
    EXPECT_EQ(runs[0].final_state[i].second.to_vector<double>(), runs[1].final_state[i].second.to_vector<double>())
        << runs[0].final_state[i].first << ": sim:0 differs from cpu";
  }
}

// Functions at the values where they break (tools/make_fixtures.py's edge_value_cases: +-inf, NaN, +-0, a
// subnormal, magnitudes past exp's range), each result and its gradient against PyTorch's, in float32 and in
// float64, on every device. Every case the fixture holds must have its function here, so a case added there is a
// case run here.
TEST(NNParityEdgeValues, FunctionsMatchPyTorchAtInfinitiesNanAndZeros) {
  namespace F = ferry::nn::functional;
  namespace N = ferry::nn;
  using Fn = std::function<Tensor(const Tensor&, const Tensor&)>;  // (input, other) -> output
  const auto one = [](Tensor (*f)(const Tensor&)) -> Fn {
    return [f](const Tensor& x, const Tensor&) { return f(x); };
  };
  const auto two = [](Tensor (*f)(const Tensor&, const Tensor&)) -> Fn {
    return [f](const Tensor& x, const Tensor& y) { return f(x, y); };
  };
  const Fixture fixture = load_fixture("edge_values");
  // An LSTM or GRU of 2 features and 3 units with the fixture's weights ("<case>/param.*"), in x's dtype.
  const auto recurrent = [&fixture](const std::string& name) -> Fn {
    return [&fixture, name](const Tensor& x, const Tensor&) {
      const ferry::TensorOptions like{.device = x.device(), .dtype = x.dtype()};
      std::shared_ptr<N::RNNBase> layer;
      if (name == "seq_lstm") layer = std::make_shared<N::LSTM>(2, 3, N::RNNOptions{}, like);
      else layer = std::make_shared<N::GRU>(2, 3, N::RNNOptions{}, like);
      layer->load_state_dict(with_prefix(fixture, name + (x.dtype() == ferry::DType::Float64 ? ".f64" : "") + "/param."));
      return layer->forward(x);
    };
  };
  const std::map<std::string, Fn> functions = {
      {"neg", one(ferry::neg)}, {"exp", one(ferry::exp)}, {"log", one(ferry::log)}, {"sqrt", one(ferry::sqrt)},
      {"rsqrt", one(ferry::rsqrt)}, {"abs", one(ferry::abs)}, {"sign", one(ferry::sign)}, {"relu", one(ferry::relu)},
      {"sigmoid", one(ferry::sigmoid)}, {"tanh", one(ferry::tanh)}, {"erf", one(ferry::erf)},
      {"square", one(ferry::square)}, {"sin", one(ferry::sin)}, {"cos", one(ferry::cos)}, {"log1p", one(ferry::log1p)},
      {"expm1", one(ferry::expm1)}, {"floor", one(ferry::floor)}, {"ceil", one(ferry::ceil)},
      {"round", one(ferry::round)}, {"trunc", one(ferry::trunc)},
      {"gelu", [](const Tensor& x, const Tensor&) { return F::gelu(x); }},
      {"gelu_tanh", [](const Tensor& x, const Tensor&) { return F::gelu(x, "tanh"); }},
      {"silu", [](const Tensor& x, const Tensor&) { return F::silu(x); }},
      {"leaky_relu", [](const Tensor& x, const Tensor&) { return F::leaky_relu(x, 0.01); }},
      {"softplus", [](const Tensor& x, const Tensor&) { return F::softplus(x); }},
      {"softplus_beta2_threshold1.5", [](const Tensor& x, const Tensor&) { return F::softplus(x, 2, 1.5); }},
      {"clamp", [](const Tensor& x, const Tensor&) { return ferry::clamp(x, -1.0, 1.0); }},
      {"clamp_min", [](const Tensor& x, const Tensor&) { return ferry::clamp(x, 0.5); }},
      {"pow_2", [](const Tensor& x, const Tensor&) { return ferry::pow(x, 2.0); }},
      {"pow_3", [](const Tensor& x, const Tensor&) { return ferry::pow(x, 3.0); }},
      {"pow_0.5", [](const Tensor& x, const Tensor&) { return ferry::pow(x, 0.5); }},
      {"pow_-1", [](const Tensor& x, const Tensor&) { return ferry::pow(x, -1.0); }},
      {"pow_0", [](const Tensor& x, const Tensor&) { return ferry::pow(x, 0.0); }},
      {"sum", [](const Tensor& x, const Tensor&) { return ferry::sum(x); }},
      {"mean", [](const Tensor& x, const Tensor&) { return ferry::mean(x); }},
      {"max", [](const Tensor& x, const Tensor&) { return ferry::max(x); }},
      {"min", [](const Tensor& x, const Tensor&) { return ferry::min(x); }},
      {"amax", [](const Tensor& x, const Tensor&) { return ferry::amax(x); }},
      {"prod", [](const Tensor& x, const Tensor&) { return ferry::prod(x); }},
      {"norm", [](const Tensor& x, const Tensor&) { return ferry::norm(x); }},
      {"std", [](const Tensor& x, const Tensor&) { return ferry::std(x); }},
      {"var", [](const Tensor& x, const Tensor&) { return ferry::var(x); }},
      {"logsumexp", [](const Tensor& x, const Tensor&) { return ferry::logsumexp(x, 0); }},
      {"cumsum", [](const Tensor& x, const Tensor&) { return ferry::cumsum(x, 0); }},
      {"softmax", [](const Tensor& x, const Tensor&) { return ferry::softmax(x, 0); }},
      {"log_softmax", [](const Tensor& x, const Tensor&) { return ferry::log_softmax(x, 0); }},
      {"add", [](const Tensor& x, const Tensor& y) { return ferry::add(x, y); }},
      {"sub", [](const Tensor& x, const Tensor& y) { return ferry::sub(x, y); }},
      {"mul", two(ferry::mul)}, {"div", two(ferry::div)},
      {"maximum", two(ferry::maximum)}, {"minimum", two(ferry::minimum)}, {"pow", two(ferry::pow)},
      {"mse_loss", [](const Tensor& x, const Tensor& t) { return N::mse_loss(x, t, N::Reduction::None); }},
      {"l1_loss", [](const Tensor& x, const Tensor& t) { return N::l1_loss(x, t, N::Reduction::None); }},
      {"smooth_l1_loss", [](const Tensor& x, const Tensor& t) { return N::smooth_l1_loss(x, t, N::Reduction::None); }},
      {"huber_loss", [](const Tensor& x, const Tensor& t) { return N::huber_loss(x, t, N::Reduction::None); }},
      {"bce_with_logits",
       [](const Tensor& x, const Tensor& t) {
         return N::binary_cross_entropy_with_logits(x, t, {.reduction = N::Reduction::None});
       }},
      {"bce",
       [](const Tensor& p, const Tensor& t) {
         return N::binary_cross_entropy(p, t, {.reduction = N::Reduction::None});
       }},
      {"kl_div",
       [](const Tensor& x, const Tensor& t) { return N::kl_div(x, t, {.reduction = N::KLDivReduction::None}); }},
      // Along the last dim of (4, 5) rows: constant, zero, holding inf, holding NaN.
      {"rows_layer_norm", [](const Tensor& x, const Tensor&) { return F::layer_norm(x, {5}); }},
      {"rows_group_norm",
       [](const Tensor& x, const Tensor&) { return F::group_norm(x.reshape({2, 2, 5}), 1).reshape({4, 5}); }},
      {"rows_normalize", [](const Tensor& x, const Tensor&) { return F::normalize(x, 2, 1); }},
      {"rows_normalize_p1", [](const Tensor& x, const Tensor&) { return F::normalize(x, 1, 1); }},
      {"rows_cosine_similarity", [](const Tensor& x, const Tensor& y) { return F::cosine_similarity(x, y, 1); }},
      {"rows_pairwise_distance", [](const Tensor& x, const Tensor& y) { return F::pairwise_distance(x, y); }},
      {"rows_norm", [](const Tensor& x, const Tensor&) { return ferry::norm(x, {1}); }},
      {"rows_std", [](const Tensor& x, const Tensor&) { return ferry::std(x, {1}); }},
      {"rows_var_single", [](const Tensor& x, const Tensor&) { return ferry::var(x.narrow(1, 0, 1), {1}); }},
      {"rows_mean", [](const Tensor& x, const Tensor&) { return ferry::mean(x, {1}); }},
      {"rows_amax", [](const Tensor& x, const Tensor&) { return ferry::amax(x, {1}); }},
      {"rows_max_dim", [](const Tensor& x, const Tensor&) { return ferry::max(x, 1).first; }},
      {"rows_logsumexp", [](const Tensor& x, const Tensor&) { return ferry::logsumexp(x, 1); }},
      {"rows_softmax", [](const Tensor& x, const Tensor&) { return ferry::softmax(x, 1); }},
      {"rows_log_softmax", [](const Tensor& x, const Tensor&) { return ferry::log_softmax(x, 1); }},
      {"rows_cross_entropy",
       [](const Tensor& x, const Tensor&) {
         const Tensor target = ferry::from_vector<std::int64_t>({0, 1, 3, 2}).to(x.device());
         return N::cross_entropy(x, target, N::Reduction::None);
       }},
      // On a (1, 2, 4, 4) image: a channel holding NaN, +inf and -inf, a constant one.
      {"img_max_pool2d", [](const Tensor& x, const Tensor&) { return F::max_pool2d(x, 2); }},
      {"img_max_pool2d_s1", [](const Tensor& x, const Tensor&) { return F::max_pool2d(x, 2, 1); }},
      {"img_avg_pool2d", [](const Tensor& x, const Tensor&) { return F::avg_pool2d(x, 2); }},
      {"img_adaptive_max_pool2d", [](const Tensor& x, const Tensor&) { return F::adaptive_max_pool2d(x, {3, 3}); }},
      {"img_adaptive_avg_pool2d", [](const Tensor& x, const Tensor&) { return F::adaptive_avg_pool2d(x, {3, 3}); }},
      {"img_upsample_bilinear2d", [](const Tensor& x, const Tensor&) { return F::upsample_bilinear2d(x, {6, 3}); }},
      {"img_upsample_bilinear2d_align",
       [](const Tensor& x, const Tensor&) { return F::upsample_bilinear2d(x, {7, 5}, true); }},
      {"img_batch_norm",
       [](const Tensor& x, const Tensor&) { return F::batch_norm(x, Tensor(), Tensor(), Tensor(), Tensor(), true); }},
      {"img_bn_relu_max_pool2d",
       [](const Tensor& x, const Tensor&) {
         return F::batch_norm_relu_max_pool2d(x, Tensor(), Tensor(), Tensor(), Tensor(), true);
       }},
      {"img_conv2d", [](const Tensor& x, const Tensor& w) { return F::conv2d(x, w, Tensor(), 1, 1); }},
      {"img_conv2d_s2", [](const Tensor& x, const Tensor& w) { return F::conv2d(x, w, Tensor(), 2); }},
      {"img_conv_transpose2d", [](const Tensor& x, const Tensor& w) { return F::conv_transpose2d(x, w, Tensor(), 2); }},
      {"rows_linear", [](const Tensor& x, const Tensor& w) { return F::linear(x, w); }},
      {"rows_linear_relu",
       [](const Tensor& x, const Tensor& w) { return F::linear(x, w, Tensor(), F::Activation::ReLU); }},
      {"rows_linear_gelu", [](const Tensor& x, const Tensor& w) { return F::gelu(F::linear(x, w)); }},
      {"seq_lstm", recurrent("seq_lstm")}, {"seq_gru", recurrent("seq_gru")},
  };
  std::vector<std::string> cases;
  for (const auto& [key, tensor] : fixture.tensors) {
    const std::size_t slash = key.rfind("/output");
    if (slash != std::string::npos && slash + 7 == key.size()) cases.push_back(key.substr(0, slash));
  }
  ASSERT_GT(cases.size(), 250U);
  std::vector<Device> devices = ferry::testing::accelerators();
  devices.insert(devices.begin(), ferry::kCPU);
  for (const Device& device : devices) {
    for (const std::string& name : cases) {
      // "max_no_nan", "softmax_ties": the function before the first '_' suffix the fixture adds; "<case>.f64" is
      // the case in float64 (its tensors are float64)
      std::string function = name;
      if (function.size() > 4 && function.compare(function.size() - 4, 4, ".f64") == 0)
        function.resize(function.size() - 4);
      for (const char* suffix : {"_no_nan", "_minus_inf", "_plus_inf", "_ties", "_zeros", "_positive_base"}) {
        const std::size_t at = function.rfind(suffix);
        if (at != std::string::npos && at + std::strlen(suffix) == function.size()) function.resize(at);
      }
      const auto found = functions.find(function);
      if (found == functions.end()) {
        ADD_FAILURE() << "the fixture's case " << name << " has no ferry function here";
        continue;
      }
      const bool binary = fixture.has(name + "/other");
      const Tensor x = fixture[name + "/input"].to(device).detach().requires_grad_(true);  // a leaf of its own
      const Tensor y = binary ? fixture[name + "/other"].to(device).detach().requires_grad_(true) : Tensor();
      Tensor out;
      try {
        out = found->second(x, y);
        out.backward(fixture[name + "/upstream"].to(device));
      } catch (const std::exception& e) {
        ADD_FAILURE() << device.str() << " " << name << " threw: " << e.what();
        continue;
      }
      // A constant row's layer_norm gradient, and a constant channel's batch_norm, are 0 but for rounding, which
      // 1 / sqrt(eps) = 316 magnifies: PyTorch's have -1.5e-5 in one place and 3e-5 throughout.
      const double atol = name == "rows_layer_norm" || name == "img_batch_norm" ? 1e-4 : 1e-6;
      // Each element that differs, with the inputs that gave it where it has their shape (all_close names the
      // first only).
      const std::vector<double> in = ferry::testing::values(fixture[name + "/input"]);
      const std::vector<double> other = binary ? ferry::testing::values(fixture[name + "/other"]) : in;
      std::vector<std::string> labels;
      for (std::size_t i = 0; i < in.size(); ++i) {
        std::ostringstream label;
        label << "at " << in[i];
        if (binary && i < other.size()) label << ", " << other[i];
        labels.push_back(label.str());
      }
      const auto differ = [&](const Tensor& got, const std::string& want_name, const char* what) {
        const bool elementwise = got.numel() == static_cast<std::int64_t>(labels.size());
        const std::string diff = ferry::testing::differences(got, fixture[want_name], 1e-5, atol,
                                                             elementwise ? labels : std::vector<std::string>{});
        EXPECT_TRUE(diff.empty()) << device.str() << " " << name << ": " << what << diff;
      };
      EXPECT_EQ(out.dtype(), fixture[name + "/output"].dtype()) << device.str() << " " << name;
      differ(out, name + "/output", "the value");
      differ(x.grad(), name + "/grad", "the gradient");
      if (binary) differ(y.grad(), name + "/grad_other", "the other's gradient");
    }
  }
}
