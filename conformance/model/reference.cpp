#include "conformance/model/reference.hpp"

#include "conformance/core/dataset.hpp"
#include "conformance/model/model.hpp"

#include "conformance/protocol/safetensors.hpp"

#include <algorithm>
#include <atomic>
#include <cmath>
#include <filesystem>
#include <functional>
#include <future>
#include <malloc.h>
#include <optional>
#include <thread>
#include <tuple>

namespace gradcert {

// NOTE [teacher forcing] A free-running comparison judges update u after both sides have
// taken u steps of their own: rounding differences compound through the updates, and at
// size (1e7 parameters and up, lr 0.1) the training dynamics amplify them past any fixed
// tolerance although nothing is wrong. So the gradient, loss and single-step checks compare
// each update where both sides stand on the same ground: the reference recomputes update u
// at the stack's own parameters after update u-1 (update 0: the shared initial weights) and
// takes one optimizer step from there, its optimizer state built from its own (forced)
// gradients. A bug is judged at the update where it acts, whatever earlier updates did.
// The free-running trajectory stays as its own check (params.trajectory), held to the
// trajectory floor below, which grows with the dynamics.
//
// NOTE [noise floor] Each tolerance is set from the run's own rounding, not from a constant
// calibrated on a toy: every update is computed a second, mathematically equal way and the
// distance between the two is the floor. float64 runs: the sum of per-(DP rank, microstep)
// pieces (one backward per microbatch, S_{r,a} / N each, as gradient accumulation does) vs
// the concatenated batch. float32 and bfloat16 runs: the concatenated batch computed in the
// run's dtype (bfloat16: bf16 compute, float32 master for the step, NOTE [mixed precision])
// vs float64, i.e. how far a correct computation in that dtype lands at this size. The
// one-step floor (teacher-forced) bounds grad.parity, grad.scale, loss.global_mean and
// params.parity; the trajectory floor (both routes free-running from the initial weights)
// bounds params.trajectory per update. The checks take max(the dtype's calibrated
// tolerance, factor x floor) (NOTE [tolerances] in conformance/core/spec.cpp), so a floor
// never tightens a tolerance below the calibrated one, and a mutant's error (a scale factor
// |f - 1| >= 1/3, a wrong example, a stale parameter) stays far above factor x floor.
// What a floor cannot see: a stack's rounding that is systematically larger than a
// plain computation in its dtype (e.g. a low-precision reduction across many ranks) shows
// as a failure, and a bug smaller than factor x floor passes; the report gives both figures.

namespace {

// One route's view of an update: the loss and N (the gradient stays in the model's .grad).
struct Evaluation {
  double loss = 0;
  int64_t valid_targets = 0;
};

DType dtype_of(torch::ScalarType t) {
  return t == torch::kFloat64 ? DType::Float64 : t == torch::kFloat32 ? DType::Float32 : DType::BFloat16;
}

// The window's gradient: every example in one batch (pieces = false), or one backward per
// (DP rank, microstep) slot of S_{r,a} / N (pieces = true).
Evaluation evaluate(const Spec& spec, TinyLM& model, const Window& w, bool pieces) {
  Evaluation e;
  model->zero_grad(/*set_to_none=*/true);
  if (!pieces) {
    Batch batch = collate(spec, w.ids);
    if (!batch.empty()) {
      e.valid_targets = batch.labels.ne(kIgnoreIndex).sum().item<int64_t>();
      auto S = loss_sum(model, batch);
      if (e.valid_targets > 0) {
        auto L = S / static_cast<double>(e.valid_targets);
        L.backward();
        e.loss = L.item<double>();
      }
    }
  } else {
    std::vector<Batch> batches;
    for (const auto& rank : w.slots)
      for (const auto& mb : rank)
        if (!mb.ids.empty()) {
          batches.push_back(collate(spec, mb.ids));
          e.valid_targets += batches.back().labels.ne(kIgnoreIndex).sum().item<int64_t>();
        }
    double S_total = 0;
    if (e.valid_targets > 0)
      for (const auto& b : batches) {
        auto S = loss_sum(model, b);
        (S / static_cast<double>(e.valid_targets)).backward();
        S_total += S.item<double>();
      }
    e.loss = e.valid_targets > 0 ? S_total / static_cast<double>(e.valid_targets) : 0;
  }
  return e;
}

// The model's parameters (grads = false) or their gradients (zeros where there is none), by name.
std::vector<std::pair<std::string, torch::Tensor>> named(TinyLM& model, bool grads) {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  for (const auto& p : model->named_parameters()) {
    torch::Tensor t = p.value().detach();
    if (grads) t = p.value().grad().defined() ? p.value().grad().detach() : torch::zeros_like(t);
    out.emplace_back(p.key(), t);
  }
  return out;
}

// Loads `params` (the stack's, as read from its artifacts) into `model`; an absent tensor or
// a wrong shape is an ArtifactError naming the update and tensor.
void load_params(TinyLM& model, const TensorMap& params, torch::ScalarType dtype, int update) {
  torch::NoGradGuard ng;
  for (auto& p : model->named_parameters()) {
    auto it = params.find(p.key());
    if (it == params.end())
      throw ArtifactError("update " + std::to_string(update) + " parameters: no tensor '" + p.key() +
                          "' to recompute the next update from");
    auto src = from_host(it->second, dtype);
    if (src.sizes() != p.value().sizes())
      throw ArtifactError("update " + std::to_string(update) + " parameters: tensor '" + p.key() +
                          "' has another shape than the model's");
    p.value().copy_(src);
  }
}

// One optimizer step of every parameter with the evaluation's gradient; bfloat16 steps a
// float32 master of the bf16 weights (the built-in recipe, NOTE [mixed precision]).
void step_all(const Spec& spec, int update, TinyLM& model, std::map<std::string, OptimizerSlot>& slots,
              std::map<std::string, torch::Tensor>& masters, torch::ScalarType dtype) {
  torch::NoGradGuard ng;
  for (auto& p : model->named_parameters()) {
    auto g = p.value().grad();
    if (!g.defined()) g = torch::zeros_like(p.value());
    if (dtype != torch::kBFloat16) {
      optimizer_step(spec.optimizer, update + 1, p.value(), g, slots[p.key()]);
      continue;
    }
    auto& master = masters[p.key()];
    if (!master.defined()) master = p.value().detach().to(torch::kFloat32);
    optimizer_step(spec.optimizer, update + 1, master, g.to(torch::kFloat32), slots[p.key()]);
    p.value().copy_(master);
  }
}

// The worst relative L2 of the model's tensors against the reference's, and the projection of
// all of them on it (|<x, r> / <r, r> - 1|), one tensor copied out at a time. `ref_of(name,
// scratch)` gives the reference's tensor of that name (nullptr: none), filling `scratch` where it
// has to be copied out of a model.
template <class RefOf>
std::pair<double, double> distance(const std::vector<std::pair<std::string, torch::Tensor>>& mine, DType dtype,
                                   RefOf ref_of) {
  double worst = 0;
  long double dot = 0, rr = 0;
  HostTensor scratch;
  for (const auto& [name, t] : mine) {
    const HostTensor* r = ref_of(name, scratch);
    if (!r) continue;
    const HostTensor h = to_host(name, t, dtype);
    const double e = compare_tensors(h, *r).relative;
    if (std::isfinite(e)) worst = std::max(worst, e);
    accumulate_projection(h, *r, dot, rr);
  }
  return {worst, rr > 0 ? std::fabs(static_cast<double>(dot / rr) - 1) : 0};
}

// The model's tensors written to `dir`/`file` one at a time and returned streamed from there
// (NOTE [streamed tensors]); with `dir` empty, returned held.
TensorMap spill(const std::string& dir, const std::string& file,
                const std::vector<std::pair<std::string, torch::Tensor>>& tensors, DType dtype) {
  TensorMap heads;
  std::map<std::string, const torch::Tensor*> by_name;
  for (const auto& [name, t] : tensors) {
    if (dir.empty()) {
      heads[name] = to_host(name, t, dtype);
      continue;
    }
    HostTensor h;
    h.name = name;
    h.shape.assign(t.sizes().begin(), t.sizes().end());
    h.dtype = dtype;
    heads[name] = std::move(h);
    by_name[name] = &t;
  }
  if (dir.empty()) return heads;
  const std::string path = dir + "/" + file;
  write_safetensors_streamed(path, heads, [&](const std::string& name, std::vector<double>& out) {
    const auto flat = by_name.at(name)->to(torch::kFloat64).contiguous().view({-1});
    out.assign(flat.data_ptr<double>(), flat.data_ptr<double>() + flat.numel());
  });
  return read_safetensors(path, expectation_of(heads));
}

// The second route of NOTE [noise floor]: pieces in float64, the concatenated batch otherwise.
struct Route {
  torch::ScalarType dtype;
  bool pieces;
};
Route floor_route(const Spec& spec) {
  if (spec.dtype == DType::Float64) return {torch::kFloat64, true};
  return {scalar_type(spec.dtype), false};
}

// One intra-op thread while it lives, as the ranks and the Python runner use: the harness shares
// the machine with the ranks, and OpenMP threads spinning on busy cores made the reference of a
// 1M-parameter run 10x slower (measured: 43 s for `gradcert check` of 8 updates).
struct OneIntraOpThread {
  const int before = torch::get_num_threads();
  OneIntraOpThread() { torch::set_num_threads(1); }
  ~OneIntraOpThread() { torch::set_num_threads(before); }
};

// One route's model and optimizer state.
struct Stepper {
  Stepper(const Spec& spec, const TensorMap& initial, Route r)
      : model(make_model(spec.model, initial, r.dtype)), route(r) {}
  // Teacher forcing: stand at `params` (the stack's after update `update`, or the initial weights).
  void stand_at(const TensorMap& params, int update) {
    load_params(model, params, route.dtype, update);
    masters.clear();  // bfloat16: the master starts from the stack's (bf16) weights
  }
  Evaluation evaluate_at(const Spec& spec, const Window& w) {
    return evaluate(spec, model, w, route.pieces);  // the model computes in route.dtype
  }
  void step(const Spec& spec, const Window& w) { step_all(spec, w.update, model, slots, masters, route.dtype); }

  TinyLM model;
  Route route;
  std::map<std::string, OptimizerSlot> slots;
  std::map<std::string, torch::Tensor> masters;
};

// Where update u starts: free-running (`run` null) where the model stands, teacher-forced at the
// stack's parameters after update u - 1 (update 0: the initial weights).
void stand(Stepper& s, const TensorMap& initial, const std::vector<BackendUpdate>* run, size_t u) {
  if (run) s.stand_at(u == 0 ? initial : (*run)[u - 1].params_after, static_cast<int>(u) - 1);
}

// f here and g on a second thread (one intra-op thread, as here) when both are given, so the
// two routes' forward, backward and step run side by side; g's exception is rethrown here.
void side_by_side(const std::function<void()>& f, const std::function<void()>& g) {
  if (!f || !g) {
    if (f) f();
    if (g) g();
    return;
  }
  auto other = std::async(std::launch::async, [&g] {
    const OneIntraOpThread one;
    g();
  });
  f();
  other.get();
}

// Which steppers a pass runs: the reference's (float64, the concatenated batch: its tensors
// spilled to `dir` under "u<k>.<tag>.*", held when `dir` is empty), the second route's (each
// update's floor is its distance from the reference's, read back one tensor at a time), or both
// at once (NOTE [routes side by side]).
enum class Routes { Reference, Floor, Both };

// One trajectory (free-running: `run` null; teacher-forced: at the stack's parameters) of the
// routes `which`, one update per window, into `ref` (a Floor pass reads the reference's there).
void pass(const Spec& spec, const Plan& plan, const TensorMap& initial, const std::vector<BackendUpdate>* run,
          Routes which, const std::string& dir, const std::string& tag, std::vector<ReferenceUpdate>& ref,
          const std::atomic<bool>* stop = nullptr) {
  const Route route = floor_route(spec);
  const DType dtype = dtype_of(route.dtype);
  std::optional<Stepper> a, b;  // the reference's route and the second route, where this pass runs them
  if (which != Routes::Floor) a.emplace(spec, initial, Route{torch::kFloat64, false});
  if (which != Routes::Reference) b.emplace(spec, initial, route);
  auto each = [&](const std::function<void()>& on_a, const std::function<void()>& on_b) {
    side_by_side(a ? on_a : nullptr, b ? on_b : nullptr);
  };
  // The second route's distance from the reference's tensors: the reference's model itself when
  // both run (the same values as its spilled tensors: the spill is exact float64), so that the
  // distance is taken while they are written; the spilled (or held) tensors otherwise.
  auto versus = [&](bool grads, const TensorMap& spilled) {
    if (!a)
      return distance(named(b->model, grads), dtype, [&](const std::string& name, HostTensor&) -> const HostTensor* {
        auto it = spilled.find(name);
        return it == spilled.end() ? nullptr : &it->second;
      });
    std::map<std::string, torch::Tensor> theirs;
    for (auto& [name, t] : named(a->model, grads)) theirs.emplace(name, t);
    auto copied_out = [&](const std::string& name, HostTensor& scratch) -> const HostTensor* {
      auto it = theirs.find(name);
      if (it == theirs.end()) return nullptr;
      scratch = to_host(name, it->second, DType::Float64);
      return &scratch;
    };
    return distance(named(b->model, grads), dtype, copied_out);
  };
  for (size_t u = 0; u < plan.windows.size() && !(stop && *stop); ++u) {
    const Window& w = plan.windows[u];
    if (!a && u >= ref.size()) break;
    if (a) ref.emplace_back();
    ReferenceUpdate& r = ref[u];
    UpdateFloor& f = r.floor;
    const std::string stem = "u" + std::to_string(w.update) + "." + tag;
    Evaluation ea, eb;
    each(
        [&] {
          stand(*a, initial, run, u);
          ea = a->evaluate_at(spec, w);
        },
        [&] {
          stand(*b, initial, run, u);
          eb = b->evaluate_at(spec, w);
        });
    if (a) {
      r.update = w.update;
      r.loss = ea.loss;
      r.valid_targets = ea.valid_targets;
    }
    each([&] { r.grads = spill(dir, stem + ".grads.safetensors", named(a->model, true), DType::Float64); },
         [&] {
           std::tie(f.grad, f.scale) = versus(true, r.grads);
           f.loss = r.loss != 0 ? std::fabs(eb.loss - r.loss) / std::fabs(r.loss) : std::fabs(eb.loss);
         });
    each([&] { a->step(spec, w); }, [&] { b->step(spec, w); });
    each([&] { r.params_after = spill(dir, stem + ".params.safetensors", named(a->model, false), DType::Float64); },
         [&] {
           f.params = versus(false, r.params_after).first;
           f.measured = true;
         });
  }
}

// NOTE [routes side by side] The reference's route and the second route of NOTE [noise floor]
// are independent computations until each update's distance, so where the machine is the
// harness's (the ranks have exited) and has two cores, one pass runs both in lockstep on two
// threads: both forward / backward at once, then the reference's tensors spilled while the
// second route's distance from them is taken (from the reference's model itself: the spill is
// exact float64), both optimizer steps at once, the parameters likewise. Both models are then
// held together, so only while their state (parameters, gradients, two optimizer slots: 4 x 8 B
// per parameter each) fits in 1 GiB, about 16M parameters; a bigger model runs one route after
// the other, holding one model at a time (so the harness stays under 2 GiB at 46M, NOTE
// [streamed tensors]). The figures are the same either way, bit for bit: each route's operations
// and their order do not change, only the thread they run on (StreamedReference test; the 144
// check figures of 13 runs identical). Measured, `gradcert run --backend ddp`, old and new
// alternated: 10M parameters 16.0 / 17.9 s -> 13.2 / 14.9 s (harness RSS 420 -> 580 MB), 1M 2.48 /
// 2.35 s -> 1.90 / 2.05 s, the default spec unchanged (0.5 s).
Routes routes_for(const TensorMap& initial, RouteThreads threads) {
  if (threads != RouteThreads::Auto) return threads == RouteThreads::Two ? Routes::Both : Routes::Reference;
  double params = 0;
  for (const auto& [name, t] : initial) params += static_cast<double>(t.numel());
  const bool fits = 2 * 4 * 8 * params <= 1024.0 * 1024 * 1024;
  return fits && std::thread::hardware_concurrency() >= 2 ? Routes::Both : Routes::Reference;
}

// Both routes of one trajectory: side by side (Routes::Both), or the reference's pass then the floor's.
std::vector<ReferenceUpdate> trajectory(const Spec& spec, const Plan& plan, const TensorMap& initial,
                                        const std::vector<BackendUpdate>* run, Routes routes, const std::string& dir,
                                        const std::string& tag, const std::atomic<bool>* stop = nullptr) {
  std::vector<ReferenceUpdate> out;
  pass(spec, plan, initial, run, routes, dir, tag, out, stop);
  if (routes == Routes::Reference)
    pass(spec, plan, initial, run, Routes::Floor, dir, tag, out, stop);
  else
    ::malloc_trim(0);  // what the second thread's malloc arena freed goes back (a model's state)
  return out;
}

// The initial weights, streamed from `spill_dir` when it is set (created; NOTE [streamed tensors]).
TensorMap initial_weights(const Spec& spec, const std::string& spill_dir) {
  TensorMap initial = initial_params(spec);
  if (spill_dir.empty()) return initial;
  std::error_code ec;
  std::filesystem::create_directories(spill_dir, ec);
  if (ec) throw ArtifactError(spill_dir + ": cannot create the reference's folder: " + ec.message());
  write_safetensors(spill_dir + "/initial.safetensors", initial);
  return read_safetensors(spill_dir + "/initial.safetensors", expectation_of(initial));
}

}  // namespace

std::vector<ReferenceUpdate> run_reference(const Spec& spec, const Plan& plan) {
  std::vector<ReferenceUpdate> out;
  pass(spec, plan, initial_params(spec), nullptr, Routes::Reference, "", "", out);
  return out;
}

References run_references(const Spec& spec, const Plan& plan, const std::vector<BackendUpdate>& run,
                          const std::string& spill_dir, const std::vector<ReferenceUpdate>* free_running,
                          RouteThreads threads) {
  const OneIntraOpThread one;
  References out;
  const TensorMap initial = initial_weights(spec, spill_dir);
  const Routes routes = routes_for(initial, threads);
  const bool forced = run.size() == plan.windows.size();

  // Free-running: the reference and the second route, each along its own trajectory.
  out.free_running = free_running ? *free_running : trajectory(spec, plan, initial, nullptr, routes, spill_dir, "free");
  if (!forced) return out;
  for (auto& r : out.free_running) r.grads.clear();  // no check reads them (grad.parity is teacher-forced)

  // Teacher-forced: both routes from the stack's parameters after the previous update; the
  // optimizer state of each route is built from its own gradients.
  out.forced = trajectory(spec, plan, initial, &run, routes, spill_dir, "forced");
  return out;
}

std::vector<ReferenceUpdate> free_running_reference(const Spec& spec, const Plan& plan, const std::string& spill_dir,
                                                    const std::atomic<bool>* stop, RouteThreads threads) {
  const OneIntraOpThread one;
  const TensorMap initial = initial_weights(spec, spill_dir);
  return trajectory(spec, plan, initial, nullptr, routes_for(initial, threads), spill_dir, "free", stop);
}

}  // namespace gradcert
