// The tiny causal LM, batching, the loss sum and the elementwise optimizer (LibTorch).
// Include only from .cpp files that need torch.
#pragma once
#include <torch/torch.h>

#include <map>
#include <string>
#include <vector>

#include "conformance/core/spec.hpp"
#include "conformance/core/tensors.hpp"
#include "conformance/protocol/safetensors.hpp"

namespace gradcert {

/// Causal multi-head self-attention from the q|k|v projection [B, T, 3C] -> [B, T, C]
/// (q, k, v are chunks of the last dim; heads split C as [heads, C / heads]).
torch::Tensor causal_self_attention(const torch::Tensor& qkv_out, int heads);

/// GPT-style block: pre-LN causal self-attention and MLP, each with a residual.
struct BlockImpl : torch::nn::Module {
  BlockImpl(const ModelSpec& m);
  torch::Tensor forward(const torch::Tensor& x);
  int heads;
  torch::nn::LayerNorm ln1{nullptr}, ln2{nullptr};
  torch::nn::Linear qkv{nullptr}, proj{nullptr}, fc{nullptr}, fc_out{nullptr};
};
TORCH_MODULE(Block);

/// Canonical parameter names: wte.weight, wpe.weight, blocks.<i>.{ln1,qkv,proj,ln2,fc,fc_out}.*,
/// ln_f.*, lm_head.weight.
struct TinyLMImpl : torch::nn::Module {
  TinyLMImpl(const ModelSpec& m);
  /// input [B, T] token ids -> logits [B, T, vocab].
  torch::Tensor forward(const torch::Tensor& input);
  torch::nn::Embedding wte{nullptr}, wpe{nullptr};
  torch::nn::ModuleList blocks{nullptr};
  torch::nn::LayerNorm ln_f{nullptr};
  torch::nn::Linear lm_head{nullptr};
};
TORCH_MODULE(TinyLM);

/// NOTE [compute device] Where this process builds models, batches and tensors read from host
/// values (make_model, collate, from_host): the CPU unless a built-in rank on `--device cuda`
/// set its GPU (run/worker.cpp). One device per process, as every rank is its own process; the
/// harness and the float64 reference never set it, so they stay on the CPU. Host values
/// (to_host, artifacts, digests) are always copied back to the CPU.
void set_compute_device(const torch::Device& device);
const torch::Device& compute_device();

/// The torch dtype for a gradcert dtype.
torch::ScalarType scalar_type(DType d);

/// The initial weights of the spec's model: drawn in float64 from spec.seed, then rounded
/// to spec.dtype (stored as double), so the reference and every backend start identical.
TensorMap initial_params(const Spec& spec);

/// The initial weights' names, shapes and dtypes, with no values (none drawn).
TensorMap initial_shapes(const Spec& spec);

/// What read_safetensors is to expect of a file that holds `tensors`: their names, shapes, dtypes.
std::map<std::string, TensorExpectation> expectation_of(const TensorMap& tensors);

/// NOTE [initial weights once] A built-in run draws its initial weights once: the harness writes
/// them to the run folder's initial.safetensors (as it does for an external stack), and each
/// rank's backends (the planned run's and the memory probes' three) read that file, strictly
/// against initial_shapes, instead of drawing 9.5M normals again per setup at 10M parameters.
/// The values are the same bits (the file stores the run dtype, which the draw was rounded to).
/// `file` empty: drawn here, as initial_params(spec).
TensorMap initial_params(const Spec& spec, const std::string& file);

/// A model in `dtype` loaded with `params` (names and shapes must match; throws naming one).
TinyLM make_model(const ModelSpec& m, const TensorMap& params, torch::ScalarType dtype);

/// Copies of the model's parameters (or their gradients; zeros where a grad is undefined).
TensorMap params_of(TinyLM& model, DType dtype);
TensorMap grads_of(TinyLM& model, DType dtype);

/// A torch tensor -> HostTensor (values converted to double).
HostTensor to_host(const std::string& name, const torch::Tensor& t, DType dtype);
/// A HostTensor -> a torch tensor of `dtype`.
torch::Tensor from_host(const HostTensor& h, torch::ScalarType dtype);

/// Examples padded on the right to the longest one (pad token, ignored labels).
struct Batch {
  torch::Tensor input;   ///< [B, T] int64
  torch::Tensor labels;  ///< [B, T] int64, kIgnoreIndex where not a target
  int64_t valid_targets = 0;
  int64_t input_tokens = 0;
  bool empty() const { return !input.defined(); }
};
/// Collates examples by id. An empty id list gives an empty Batch.
Batch collate(const Spec& spec, const std::vector<int64_t>& ids);

/// S: the sum of token cross-entropies over valid targets (float64 for float64 models,
/// float32 otherwise). Zero (with a graph) for a batch without targets.
torch::Tensor loss_sum(TinyLM& model, const Batch& batch);

/// The pieces of forward that model-parallel strategies split: token + position embedding,
/// and from the last block's output to S (ln_f, lm_head, cross-entropy sum).
torch::Tensor embed_tokens(TinyLM& model, const torch::Tensor& input);
torch::Tensor head_loss_sum(TinyLM& model, const torch::Tensor& hidden, const torch::Tensor& labels);
/// The cross-entropy sum of logits against labels (ignoring kIgnoreIndex; bf16 in float32).
torch::Tensor token_loss_sum(torch::Tensor logits, const torch::Tensor& labels);

/// Elementwise optimizer state for one parameter (or one shard of it).
struct OptimizerSlot {
  torch::Tensor m, v;  ///< momentum buffer / AdamW moments
};

/// Applies one optimizer step to `param` in place with gradient `grad` (same shape),
/// `step` counting from 1. SGD (optionally with momentum) or AdamW (decoupled decay).
void optimizer_step(const OptimizerSpec& opt, int64_t step, torch::Tensor param, const torch::Tensor& grad,
                    OptimizerSlot& slot);

}  // namespace gradcert
