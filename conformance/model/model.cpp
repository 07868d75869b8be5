#include "conformance/model/model.hpp"

#include <ATen/CPUGeneratorImpl.h>

#include <cmath>

#include "conformance/core/dataset.hpp"

namespace gradcert {

namespace F = torch::nn::functional;

BlockImpl::BlockImpl(const ModelSpec& m) : heads(m.heads) {
  ln1 = register_module("ln1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})));
  // NOTE [no key bias] A key bias has an identically zero gradient (softmax is invariant
  // to a per-query constant), so its "gradient" is rounding noise, which AdamW divides by
  // sqrt(v) + eps and turns into parameter noise of lr * noise / eps. Like Llama, the
  // attention projections have no bias, so every parameter's gradient carries signal.
  qkv = register_module("qkv", torch::nn::Linear(torch::nn::LinearOptions(m.d_model, 3 * m.d_model).bias(false)));
  proj = register_module("proj", torch::nn::Linear(m.d_model, m.d_model));
  ln2 = register_module("ln2", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})));
  fc = register_module("fc", torch::nn::Linear(m.d_model, m.d_ff));
  fc_out = register_module("fc_out", torch::nn::Linear(m.d_ff, m.d_model));
}

torch::Tensor causal_self_attention(const torch::Tensor& qkv_out, int heads) {
  const auto B = qkv_out.size(0), T = qkv_out.size(1), C = qkv_out.size(2) / 3;
  const auto hd = C / heads;
  auto parts = qkv_out.chunk(3, -1);
  auto split = [&](const torch::Tensor& t) { return t.reshape({B, T, heads, hd}).transpose(1, 2); };
  auto q = split(parts[0]), k = split(parts[1]), v = split(parts[2]);
  auto scores = torch::matmul(q, k.transpose(-2, -1)) / std::sqrt(static_cast<double>(hd));
  // Causal mask. With right padding, real positions never attend to padding.
  auto future = torch::ones({T, T}, torch::TensorOptions().dtype(torch::kBool).device(qkv_out.device())).triu(1);
  scores = scores.masked_fill(future, -std::numeric_limits<double>::infinity());
  return torch::matmul(torch::softmax(scores, -1), v).transpose(1, 2).reshape({B, T, C});
}

torch::Tensor BlockImpl::forward(const torch::Tensor& x) {
  auto h = x + proj->forward(causal_self_attention(qkv->forward(ln1->forward(x)), heads));
  return h + fc_out->forward(torch::gelu(fc->forward(ln2->forward(h))));
}

TinyLMImpl::TinyLMImpl(const ModelSpec& m) {
  wte = register_module("wte", torch::nn::Embedding(m.vocab, m.d_model));
  wpe = register_module("wpe", torch::nn::Embedding(m.max_len, m.d_model));
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int i = 0; i < m.layers; ++i) blocks->push_back(Block(m));
  ln_f = register_module("ln_f", torch::nn::LayerNorm(torch::nn::LayerNormOptions({m.d_model})));
  lm_head = register_module("lm_head", torch::nn::Linear(torch::nn::LinearOptions(m.d_model, m.vocab).bias(false)));
}

torch::Tensor TinyLMImpl::forward(const torch::Tensor& input) {
  auto pos = torch::arange(input.size(1), torch::TensorOptions().dtype(torch::kLong).device(input.device()));
  auto x = wte->forward(input) + wpe->forward(pos).unsqueeze(0);
  for (const auto& b : *blocks) x = b->as<Block>()->forward(x);
  return lm_head->forward(ln_f->forward(x));
}

torch::ScalarType scalar_type(DType d) {
  switch (d) {
    case DType::Float64: return torch::kFloat64;
    case DType::Float32: return torch::kFloat32;
    case DType::BFloat16: return torch::kBFloat16;
  }
  return torch::kFloat64;
}

HostTensor to_host(const std::string& name, const torch::Tensor& t, DType dtype) {
  HostTensor h;
  h.name = name;
  h.dtype = dtype;
  h.shape.assign(t.sizes().begin(), t.sizes().end());
  auto flat = t.detach().to(torch::kFloat64).cpu().contiguous().view({-1});
  h.held.assign(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
  return h;
}

torch::Tensor from_host(const HostTensor& h, torch::ScalarType dtype) {
  const TensorValues v = h.read();  // a streamed tensor (the stack's parameters) is read here
  auto t = torch::from_blob(const_cast<double*>(v.data()), h.shape, torch::kFloat64);
  return compute_device().is_cpu() ? t.to(dtype).clone() : t.to(compute_device(), dtype);
}

namespace {
torch::Device& device_of_process() {
  static torch::Device d(torch::kCPU);
  return d;
}
}  // namespace

void set_compute_device(const torch::Device& device) { device_of_process() = device; }
const torch::Device& compute_device() { return device_of_process(); }

TensorMap initial_params(const Spec& spec) {
  TinyLM shape_only(spec.model);
  auto gen = at::make_generator<at::CPUGeneratorImpl>(spec.seed);
  TensorMap out;
  torch::NoGradGuard ng;
  for (const auto& p : shape_only->named_parameters()) {
    const auto& name = p.key();
    torch::Tensor init;
    const bool is_norm = name.find("ln") != std::string::npos;
    if (is_norm && name.size() > 7 && name.substr(name.size() - 7) == ".weight")
      init = torch::ones(p.value().sizes(), torch::kFloat64);
    else if (name.size() > 5 && name.substr(name.size() - 5) == ".bias")
      init = torch::randn(p.value().sizes(), gen, torch::kFloat64) * 0.01;
    else
      init = torch::randn(p.value().sizes(), gen, torch::kFloat64) * 0.2;
    // Round through the run dtype so a float32 backend and the float64 reference start equal.
    out[name] = to_host(name, init.to(scalar_type(spec.dtype)), spec.dtype);
  }
  return out;
}

TensorMap initial_shapes(const Spec& spec) {
  TinyLM shape_only(spec.model);
  TensorMap out;
  for (const auto& p : shape_only->named_parameters()) {
    HostTensor& h = out[p.key()];
    h.name = p.key();
    h.dtype = spec.dtype;
    h.shape.assign(p.value().sizes().begin(), p.value().sizes().end());
  }
  return out;
}

std::map<std::string, TensorExpectation> expectation_of(const TensorMap& tensors) {
  std::map<std::string, TensorExpectation> expect;
  for (const auto& [name, h] : tensors) expect[name] = {h.shape, h.dtype};
  return expect;
}

TensorMap initial_params(const Spec& spec, const std::string& file) {
  if (file.empty()) return initial_params(spec);
  return read_safetensors(file, expectation_of(initial_shapes(spec)));
}

TinyLM make_model(const ModelSpec& m, const TensorMap& params, torch::ScalarType dtype) {
  TinyLM model(m);
  model->to(compute_device(), dtype);
  torch::NoGradGuard ng;
  for (auto& p : model->named_parameters()) {
    auto it = params.find(p.key());
    if (it == params.end()) throw std::invalid_argument("initial weights lack parameter '" + p.key() + "'");
    auto src = from_host(it->second, dtype);
    if (src.sizes() != p.value().sizes())
      throw std::invalid_argument("initial weights: parameter '" + p.key() + "' has the wrong shape");
    p.value().copy_(src);
  }
  if (params.size() != model->named_parameters().size())
    throw std::invalid_argument("initial weights hold parameters the model does not have");
  return model;
}

TensorMap params_of(TinyLM& model, DType dtype) {
  TensorMap out;
  for (const auto& p : model->named_parameters()) out[p.key()] = to_host(p.key(), p.value(), dtype);
  return out;
}

TensorMap grads_of(TinyLM& model, DType dtype) {
  TensorMap out;
  for (const auto& p : model->named_parameters()) {
    auto g = p.value().grad();
    out[p.key()] = to_host(p.key(), g.defined() ? g : torch::zeros_like(p.value()), dtype);
  }
  return out;
}

Batch collate(const Spec& spec, const std::vector<int64_t>& ids) {
  Batch b;
  if (ids.empty()) return b;
  std::vector<Sample> samples;
  size_t T = 1;
  for (auto id : ids) {
    samples.push_back(make_sample(spec, id));
    T = std::max(T, samples.back().tokens.size());
  }
  const auto B = static_cast<int64_t>(ids.size());
  b.input = torch::full({B, static_cast<int64_t>(T)}, kPadToken, torch::kLong);
  b.labels = torch::full({B, static_cast<int64_t>(T)}, kIgnoreIndex, torch::kLong);
  auto in = b.input.accessor<int64_t, 2>();
  auto lab = b.labels.accessor<int64_t, 2>();
  for (int64_t i = 0; i < B; ++i) {
    const auto& s = samples[i];
    for (size_t t = 0; t < s.tokens.size(); ++t) {
      in[i][t] = s.tokens[t];
      lab[i][t] = s.labels[t];
    }
    b.valid_targets += s.valid_targets();
    b.input_tokens += static_cast<int64_t>(s.tokens.size());
  }
  if (!compute_device().is_cpu()) {
    b.input = b.input.to(compute_device());
    b.labels = b.labels.to(compute_device());
  }
  return b;
}

torch::Tensor token_loss_sum(torch::Tensor logits, const torch::Tensor& labels) {
  if (logits.scalar_type() == torch::kBFloat16) logits = logits.to(torch::kFloat32);
  return F::cross_entropy(logits.reshape({-1, logits.size(-1)}), labels.reshape({-1}),
                          F::CrossEntropyFuncOptions().ignore_index(kIgnoreIndex).reduction(torch::kSum));
}

torch::Tensor loss_sum(TinyLM& model, const Batch& batch) {
  return token_loss_sum(model->forward(batch.input), batch.labels);
}

torch::Tensor embed_tokens(TinyLM& model, const torch::Tensor& input) {
  auto pos = torch::arange(input.size(1), torch::TensorOptions().dtype(torch::kLong).device(input.device()));
  return model->wte->forward(input) + model->wpe->forward(pos).unsqueeze(0);
}

torch::Tensor head_loss_sum(TinyLM& model, const torch::Tensor& hidden, const torch::Tensor& labels) {
  return token_loss_sum(model->lm_head->forward(model->ln_f->forward(hidden)), labels);
}

void optimizer_step(const OptimizerSpec& opt, int64_t step, torch::Tensor param, const torch::Tensor& grad,
                    OptimizerSlot& slot) {
  torch::NoGradGuard ng;
  if (opt.name == "sgd") {
    auto d = grad;
    if (opt.weight_decay != 0) d = d + opt.weight_decay * param;
    if (opt.momentum != 0) {
      if (!slot.m.defined())
        slot.m = d.clone();
      else
        slot.m.mul_(opt.momentum).add_(d);
      d = slot.m;
    }
    param.add_(d, -opt.learning_rate());
    return;
  }
  // AdamW (Loshchilov & Hutter): decoupled weight decay, bias-corrected moments.
  if (!slot.m.defined()) {
    slot.m = torch::zeros_like(param);
    slot.v = torch::zeros_like(param);
  }
  const double lr = opt.learning_rate();
  param.mul_(1 - lr * opt.weight_decay);
  slot.m.mul_(opt.beta1).add_(grad, 1 - opt.beta1);
  slot.v.mul_(opt.beta2).addcmul_(grad, grad, 1 - opt.beta2);
  const double bc1 = 1 - std::pow(opt.beta1, static_cast<double>(step));
  const double bc2 = 1 - std::pow(opt.beta2, static_cast<double>(step));
  auto denom = (slot.v / bc2).sqrt_().add_(opt.eps);
  param.addcdiv_(slot.m, denom, -lr / bc1);
}

}  // namespace gradcert
