#include "conformance/tests/recording_pg.hpp"

#include <ATen/core/LegacyTypeDispatch.h>
#include <torch/csrc/distributed/c10d/Types.hpp>
#include <torch/csrc/distributed/c10d/Utils.hpp>

#include <algorithm>
#include <sstream>

namespace gradcert {

namespace {

using c10d::OpType;
using c10d::ReduceOp;
using c10d::Work;

// NOTE [completed work] A Work that is finished when it is made: wait() returns true,
// isCompleted() and isSuccess() are true, result() and getFuture() carry the output
// tensors (as ProcessGroupGloo's do), getFutureResult() is a completed WorkResult::SUCCESS.
class CompletedWork : public Work {
 public:
  CompletedWork(int rank, OpType type, std::vector<at::Tensor> result, int source_rank = -1)
      : Work(rank, type), result_(std::move(result)), source_rank_(source_rank) {
    finish();
  }
  bool isCompleted() override { return true; }
  bool isSuccess() const override { return true; }
  bool wait(std::chrono::milliseconds /*timeout*/ = kNoTimeout) override { return true; }
  void synchronize() override {}
  int sourceRank() const override {
    TORCH_CHECK(source_rank_ >= 0, "RecordingBackend: sourceRank() is only defined for recvAnysource");
    return source_rank_;
  }
  std::vector<at::Tensor> result() override { return result_; }
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()));
    fut->markCompleted(c10::IValue(result_));
    return fut;
  }
  c10::intrusive_ptr<c10::ivalue::Future> getFutureResult() override {
    auto fut = c10::make_intrusive<c10::ivalue::Future>(c10::IntType::get());
    fut->markCompleted(c10::IValue(static_cast<int64_t>(c10d::WorkResult::SUCCESS)));
    return fut;
  }

 private:
  std::vector<at::Tensor> result_;
  int source_rank_;
};

c10::intrusive_ptr<Work> done(int rank, OpType type, std::vector<at::Tensor> result = {}, int source = -1) {
  return c10::make_intrusive<CompletedWork>(rank, type, std::move(result), source);
}

std::string reduce_name(const ReduceOp& op) {
  switch (op.op_) {
    case ReduceOp::SUM: return "SUM";
    case ReduceOp::AVG: return "AVG";
    case ReduceOp::PRODUCT: return "PRODUCT";
    case ReduceOp::MIN: return "MIN";
    case ReduceOp::MAX: return "MAX";
    case ReduceOp::BAND: return "BAND";
    case ReduceOp::BOR: return "BOR";
    case ReduceOp::BXOR: return "BXOR";
    case ReduceOp::PREMUL_SUM: return "PREMUL_SUM";
    default: return "UNUSED";
  }
}

// `t` (one rank's value) becomes the reduction of `size` copies of it.
void reduce_identical(at::Tensor& t, const ReduceOp& op, int size) {
  switch (op.op_) {
    case ReduceOp::SUM: t.mul_(size); break;
    case ReduceOp::PRODUCT: t.pow_(size); break;
    case ReduceOp::BXOR:
      if (size % 2 == 0) t.zero_();
      break;
    case ReduceOp::PREMUL_SUM: {
      auto* s = dynamic_cast<c10d::PreMulSumSupplement*>(op.supplement_.get());
      TORCH_CHECK(s, "RecordingBackend: PREMUL_SUM without a PreMulSumSupplement");
      if (s->tensor_factor.defined())
        t.mul_(s->tensor_factor.to(t.options()) * size);
      else
        t.mul_(s->double_factor * size);
      break;
    }
    default: break;  // AVG, MIN, MAX, BAND, BOR: identical ranks leave the value as is
  }
}

int64_t numel_of(const std::vector<at::Tensor>& ts) {
  int64_t n = 0;
  for (const auto& t : ts) n += t.numel();
  return n;
}

int64_t numel_of(const std::vector<std::vector<at::Tensor>>& tss) {
  int64_t n = 0;
  for (const auto& ts : tss) n += numel_of(ts);
  return n;
}

// The rows [offset, offset + length) of dim 0 for each rank, from split sizes (empty: equal).
std::vector<std::pair<int64_t, int64_t>> slots(const at::Tensor& t, const std::vector<int64_t>& splits, int size) {
  std::vector<std::pair<int64_t, int64_t>> out;
  int64_t offset = 0;
  for (int j = 0; j < size; ++j) {
    const int64_t len = splits.empty() ? (t.dim() == 0 ? 0 : t.size(0) / size) : splits[j];
    out.emplace_back(offset, len);
    offset += len;
  }
  return out;
}

}  // namespace

RecordingBackend::RecordingBackend(int rank, int size, std::string label)
    : c10d::Backend(rank, size), label_(std::move(label)) {
  TORCH_CHECK(size >= 1 && rank >= 0 && rank < size, "RecordingBackend: rank ", rank, " outside a group of ", size);
}

const std::vector<RecordedOp>& RecordingBackend::ops() const { return ops_; }

void RecordingBackend::clear() {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.clear();
}

void RecordingBackend::record(RecordedOp op) {
  std::lock_guard<std::mutex> lock(mutex_);
  ops_.push_back(std::move(op));
}

const std::string RecordingBackend::getBackendName() const { return "recording:" + label_; }

c10::intrusive_ptr<c10d::Backend::Options> RecordingBackend::getBackendOptions() {
  return c10::make_intrusive<Options>("recording");
}

c10::intrusive_ptr<Work> RecordingBackend::broadcast(std::vector<at::Tensor>& tensors, const c10d::BroadcastOptions&) {
  record({"broadcast", -1, 0, numel_of(tensors), ""});
  return done(rank_, OpType::BROADCAST, tensors);
}

c10::intrusive_ptr<Work> RecordingBackend::allreduce(std::vector<at::Tensor>& tensors,
                                                     const c10d::AllreduceOptions& opts) {
  record({"allreduce", -1, 0, numel_of(tensors), reduce_name(opts.reduceOp)});
  // NOTE [below autograd] Real backends write outputs from kernels autograd never sees;
  // so do we (an in-place op on a leaf that requires grad would otherwise throw).
  at::AutoDispatchBelowAutograd guard;
  for (auto& t : tensors) reduce_identical(t, opts.reduceOp, size_);
  return done(rank_, OpType::ALLREDUCE, tensors);
}

c10::intrusive_ptr<Work> RecordingBackend::allreduce_coalesced(std::vector<at::Tensor>& tensors,
                                                               const c10d::AllreduceCoalescedOptions& opts) {
  record({"allreduce_coalesced", -1, 0, numel_of(tensors), reduce_name(opts.reduceOp)});
  at::AutoDispatchBelowAutograd guard;
  for (auto& t : tensors) reduce_identical(t, opts.reduceOp, size_);
  return done(rank_, OpType::ALLREDUCE_COALESCED, tensors);
}

c10::intrusive_ptr<Work> RecordingBackend::reduce(std::vector<at::Tensor>& tensors, const c10d::ReduceOptions& opts) {
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "RecordingBackend::reduce: root ", opts.rootRank,
              " outside a group of ", size_);
  record({"reduce", -1, 0, numel_of(tensors), reduce_name(opts.reduceOp)});
  at::AutoDispatchBelowAutograd guard;
  if (rank_ == opts.rootRank)
    for (auto& t : tensors) reduce_identical(t, opts.reduceOp, size_);
  return done(rank_, OpType::REDUCE, tensors);
}

c10::intrusive_ptr<Work> RecordingBackend::allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                                     std::vector<at::Tensor>& inputs, const c10d::AllgatherOptions&) {
  TORCH_CHECK(outputs.size() == inputs.size(), "RecordingBackend::allgather: ", outputs.size(), " output lists for ",
              inputs.size(), " inputs");
  record({"allgather", -1, 0, numel_of(inputs), ""});
  at::AutoDispatchBelowAutograd guard;
  std::vector<at::Tensor> result;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(static_cast<int>(outputs[i].size()) == size_, "RecordingBackend::allgather: output list of ",
                outputs[i].size(), " tensors in a group of ", size_);
    for (auto& o : outputs[i]) {
      o.copy_(inputs[i]);
      result.push_back(o);
    }
  }
  return done(rank_, OpType::ALLGATHER, result);
}

c10::intrusive_ptr<Work> RecordingBackend::_allgather_base(at::Tensor& output, at::Tensor& input,
                                                           const c10d::AllgatherOptions&) {
  TORCH_CHECK(output.numel() == input.numel() * size_, "RecordingBackend::_allgather_base: output of ", output.numel(),
              " elements for an input of ", input.numel(), " in a group of ", size_);
  TORCH_CHECK(output.scalar_type() == input.scalar_type(), "RecordingBackend::_allgather_base: dtypes differ");
  record({"allgather_base", -1, 0, input.numel(), ""});
  at::AutoDispatchBelowAutograd guard;
  output.copy_(input.reshape({-1}).repeat({size_}).view(output.sizes()));
  return done(rank_, OpType::_ALLGATHER_BASE, {output});
}

c10::intrusive_ptr<Work> RecordingBackend::allgather_coalesced(std::vector<std::vector<at::Tensor>>& outputs,
                                                               std::vector<at::Tensor>& inputs,
                                                               const c10d::AllgatherOptions&) {
  record({"allgather_coalesced", -1, 0, numel_of(inputs), ""});
  at::AutoDispatchBelowAutograd guard;
  std::vector<at::Tensor> result;
  for (auto& list : outputs) {
    TORCH_CHECK(list.size() == inputs.size(), "RecordingBackend::allgather_coalesced: an output list of ", list.size(),
                " tensors for ", inputs.size(), " inputs");
    for (size_t i = 0; i < inputs.size(); ++i) {
      list[i].copy_(inputs[i]);
      result.push_back(list[i]);
    }
  }
  return done(rank_, OpType::ALLGATHER_COALESCED, result);
}

c10::intrusive_ptr<Work> RecordingBackend::allgather_into_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::AllgatherOptions&) {
  TORCH_CHECK(outputs.size() == inputs.size(), "RecordingBackend::allgather_into_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  record({"allgather_into_tensor_coalesced", -1, 0, numel_of(inputs), ""});
  at::AutoDispatchBelowAutograd guard;
  for (size_t i = 0; i < inputs.size(); ++i) {
    TORCH_CHECK(outputs[i].numel() == inputs[i].numel() * size_,
                "RecordingBackend::allgather_into_tensor_coalesced: output ", i, " has ", outputs[i].numel(),
                " elements for an input of ", inputs[i].numel(), " in a group of ", size_);
    outputs[i].copy_(inputs[i].reshape({-1}).repeat({size_}).view(outputs[i].sizes()));
  }
  return done(rank_, OpType::COALESCED, outputs);
}

c10::intrusive_ptr<Work> RecordingBackend::gather(std::vector<std::vector<at::Tensor>>& outputs,
                                                  std::vector<at::Tensor>& inputs, const c10d::GatherOptions& opts) {
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "RecordingBackend::gather: root ", opts.rootRank,
              " outside a group of ", size_);
  TORCH_CHECK(inputs.size() == 1, "RecordingBackend::gather: needs one input tensor");
  record({"gather", -1, 0, numel_of(inputs), ""});
  at::AutoDispatchBelowAutograd guard;
  std::vector<at::Tensor> result;
  if (rank_ == opts.rootRank) {
    TORCH_CHECK(outputs.size() == 1 && static_cast<int>(outputs[0].size()) == size_,
                "RecordingBackend::gather: the root needs one output list of ", size_, " tensors");
    for (auto& o : outputs[0]) {
      o.copy_(inputs[0]);
      result.push_back(o);
    }
  }
  return done(rank_, OpType::GATHER, result);
}

c10::intrusive_ptr<Work> RecordingBackend::scatter(std::vector<at::Tensor>& outputs,
                                                   std::vector<std::vector<at::Tensor>>& inputs,
                                                   const c10d::ScatterOptions& opts) {
  TORCH_CHECK(opts.rootRank >= 0 && opts.rootRank < size_, "RecordingBackend::scatter: root ", opts.rootRank,
              " outside a group of ", size_);
  TORCH_CHECK(outputs.size() == 1, "RecordingBackend::scatter: needs one output tensor");
  record({"scatter", -1, 0, numel_of(outputs), ""});
  at::AutoDispatchBelowAutograd guard;
  if (rank_ == opts.rootRank) {
    TORCH_CHECK(inputs.size() == 1 && static_cast<int>(inputs[0].size()) == size_,
                "RecordingBackend::scatter: the root needs one input list of ", size_, " tensors");
    outputs[0].copy_(inputs[0][rank_]);
  }
  return done(rank_, OpType::SCATTER, outputs);
}

c10::intrusive_ptr<Work> RecordingBackend::reduce_scatter(std::vector<at::Tensor>& outputs,
                                                          std::vector<std::vector<at::Tensor>>& inputs,
                                                          const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "RecordingBackend::reduce_scatter: ", outputs.size(), " outputs for ",
              inputs.size(), " input lists");
  record({"reduce_scatter", -1, 0, numel_of(inputs), reduce_name(opts.reduceOp)});
  at::AutoDispatchBelowAutograd guard;
  for (size_t i = 0; i < outputs.size(); ++i) {
    TORCH_CHECK(static_cast<int>(inputs[i].size()) == size_, "RecordingBackend::reduce_scatter: input list of ",
                inputs[i].size(), " tensors in a group of ", size_);
    outputs[i].copy_(inputs[i][rank_]);
    reduce_identical(outputs[i], opts.reduceOp, size_);
  }
  return done(rank_, OpType::REDUCE_SCATTER, outputs);
}

c10::intrusive_ptr<Work> RecordingBackend::_reduce_scatter_base(at::Tensor& output, at::Tensor& input,
                                                                const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(input.numel() == output.numel() * size_, "RecordingBackend::_reduce_scatter_base: input of ",
              input.numel(), " elements for an output of ", output.numel(), " in a group of ", size_);
  record({"reduce_scatter_base", -1, 0, input.numel(), reduce_name(opts.reduceOp)});
  at::AutoDispatchBelowAutograd guard;
  const int64_t n = output.numel();
  output.copy_(input.reshape({-1}).narrow(0, rank_ * n, n).view(output.sizes()));
  reduce_identical(output, opts.reduceOp, size_);
  return done(rank_, OpType::_REDUCE_SCATTER_BASE, {output});
}

c10::intrusive_ptr<Work> RecordingBackend::reduce_scatter_tensor_coalesced(std::vector<at::Tensor>& outputs,
                                                                           std::vector<at::Tensor>& inputs,
                                                                           const c10d::ReduceScatterOptions& opts) {
  TORCH_CHECK(outputs.size() == inputs.size(), "RecordingBackend::reduce_scatter_tensor_coalesced: ", outputs.size(),
              " outputs for ", inputs.size(), " inputs");
  record({"reduce_scatter_tensor_coalesced", -1, 0, numel_of(inputs), reduce_name(opts.reduceOp)});
  at::AutoDispatchBelowAutograd guard;
  for (size_t i = 0; i < outputs.size(); ++i) {
    const int64_t n = outputs[i].numel();
    TORCH_CHECK(inputs[i].numel() == n * size_, "RecordingBackend::reduce_scatter_tensor_coalesced: input ", i, " has ",
                inputs[i].numel(), " elements for an output of ", n, " in a group of ", size_);
    outputs[i].copy_(inputs[i].reshape({-1}).narrow(0, rank_ * n, n).view(outputs[i].sizes()));
    reduce_identical(outputs[i], opts.reduceOp, size_);
  }
  return done(rank_, OpType::REDUCE_SCATTER_TENSOR_COALESCED, outputs);
}

c10::intrusive_ptr<Work> RecordingBackend::alltoall_base(at::Tensor& output, at::Tensor& input,
                                                         std::vector<int64_t>& output_splits,
                                                         std::vector<int64_t>& input_splits,
                                                         const c10d::AllToAllOptions&) {
  c10d::checkSplitSizes(input_splits, input, size_);
  c10d::checkSplitSizes(output_splits, output, size_);
  record({"alltoall_base", -1, 0, input.numel(), ""});
  at::AutoDispatchBelowAutograd guard;
  // Rank j sends us its slot [rank]; identical ranks all send this rank's own slot [rank].
  const auto in = slots(input, input_splits, size_)[rank_];
  const auto src = input.narrow(0, in.first, in.second);
  for (const auto& [offset, len] : slots(output, output_splits, size_)) {
    auto dst = output.narrow(0, offset, len);
    const int64_t m = std::min(len, in.second);
    dst.narrow(0, 0, m).copy_(src.narrow(0, 0, m));
    if (m < len) dst.narrow(0, m, len - m).zero_();  // inconsistent splits: pad with zeros
  }
  return done(rank_, OpType::ALLTOALL_BASE, {output});
}

c10::intrusive_ptr<Work> RecordingBackend::alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                                    const c10d::AllToAllOptions&) {
  TORCH_CHECK(static_cast<int>(outputs.size()) == size_ && static_cast<int>(inputs.size()) == size_,
              "RecordingBackend::alltoall: needs ", size_, " inputs and outputs");
  record({"alltoall", -1, 0, numel_of(inputs), ""});
  at::AutoDispatchBelowAutograd guard;
  for (auto& o : outputs) o.copy_(inputs[rank_]);
  return done(rank_, OpType::ALLTOALL, outputs);
}

c10::intrusive_ptr<Work> RecordingBackend::send(std::vector<at::Tensor>& tensors, int dst, int tag) {
  TORCH_CHECK(dst >= 0 && dst < size_ && dst != rank_, "RecordingBackend::send: rank ", rank_, " sends to ", dst,
              " in a group of ", size_);
  record({"send", dst, tag, numel_of(tensors), ""});
  return done(rank_, OpType::SEND);
}

c10::intrusive_ptr<Work> RecordingBackend::recv(std::vector<at::Tensor>& tensors, int src, int tag) {
  TORCH_CHECK(src >= 0 && src < size_ && src != rank_, "RecordingBackend::recv: rank ", rank_, " receives from ", src,
              " in a group of ", size_);
  record({"recv", src, tag, numel_of(tensors), ""});
  at::AutoDispatchBelowAutograd guard;
  for (auto& t : tensors) t.zero_();
  return done(rank_, OpType::RECV, tensors);
}

c10::intrusive_ptr<Work> RecordingBackend::recvAnysource(std::vector<at::Tensor>& tensors, int tag) {
  record({"recv_anysource", -1, tag, numel_of(tensors), ""});
  at::AutoDispatchBelowAutograd guard;
  for (auto& t : tensors) t.zero_();
  return done(rank_, OpType::RECVANYSOURCE, tensors, (rank_ + 1) % size_);
}

c10::intrusive_ptr<Work> RecordingBackend::barrier(const c10d::BarrierOptions&) {
  record({"barrier", -1, 0, 0, ""});
  return done(rank_, OpType::BARRIER);
}

void RecordingBackend::monitoredBarrier(const c10d::BarrierOptions&, bool) {
  record({"monitored_barrier", -1, 0, 0, ""});
}

std::string ops_text(const std::vector<RecordedOp>& ops) {
  std::ostringstream os;
  for (const auto& o : ops) {
    os << o.op;
    if (!o.reduce_op.empty()) os << ' ' << o.reduce_op;
    if (o.op == "send") os << " ->" << o.peer << " tag " << o.tag;
    if (o.op == "recv") os << " <-" << o.peer << " tag " << o.tag;
    if (o.op == "recv_anysource") os << " <-any tag " << o.tag;
    if (o.op != "barrier" && o.op != "monitored_barrier") os << ' ' << o.numel;
    os << '\n';
  }
  return os.str();
}

}  // namespace gradcert
