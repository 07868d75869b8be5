// A c10d::Backend test double (the idea of torch's FakeProcessGroup) that records every
// collective a rank issues and completes it at once, so single-process unit tests can pin
// a training strategy's collective sequence.
#pragma once
#include <torch/csrc/distributed/c10d/Backend.hpp>

namespace gradcert {

/// One collective call as a rank issued it.
struct RecordedOp {
  std::string
      op;  ///< "allreduce" | "allgather" | "allgather_base" | "reduce_scatter" | "reduce_scatter_base" | "broadcast" | "send" | "recv" | "barrier" | "alltoall_base" | ...
  int peer = -1;  ///< send/recv: the other rank; -1 otherwise (and for recv_anysource)
  int tag = 0;    ///< send/recv tag
  int64_t numel =
      0;  ///< elements of the input tensor(s) this rank contributes, summed (recv/scatter: of the tensors filled)
  std::string reduce_op;  ///< "SUM", "AVG", ... for reductions, "" otherwise
};

/// A c10d::Backend that performs no communication: it records each call and completes it
/// at once with the results a world of identical ranks would produce (allreduce SUM:
/// input * size; AVG, MAX, MIN: unchanged; allgather: the input in every slot;
/// reduce_scatter SUM: input chunk [rank] * size; broadcast: unchanged; recv: zeros;
/// send: nothing), so strategies run with finite values. Thread-safe.
class RecordingBackend : public c10d::Backend {
 public:
  /// A group of `size` ranks seen from `rank`; `label` names it ("dp", "tp") in messages.
  RecordingBackend(int rank, int size, std::string label = "pg");
  /// Every call so far, in issue order.
  const std::vector<RecordedOp>& ops() const;
  /// Forgets the calls recorded so far.
  void clear();
  /// The label given at construction.
  const std::string& label() const { return label_; }

  /// "recording:<label>".
  const std::string getBackendName() const override;
  /// Plain options named "recording".
  c10::intrusive_ptr<Options> getBackendOptions() override;

  /// Unchanged (every rank holds the root's value).
  c10::intrusive_ptr<c10d::Work> broadcast(std::vector<at::Tensor>& tensors,
                                           const c10d::BroadcastOptions& opts = c10d::BroadcastOptions()) override;
  /// Each tensor reduced as over `size` identical ranks.
  c10::intrusive_ptr<c10d::Work> allreduce(std::vector<at::Tensor>& tensors,
                                           const c10d::AllreduceOptions& opts = c10d::AllreduceOptions()) override;
  /// As allreduce, recorded as "allreduce_coalesced".
  c10::intrusive_ptr<c10d::Work> allreduce_coalesced(
      std::vector<at::Tensor>& tensors,
      const c10d::AllreduceCoalescedOptions& opts = c10d::AllreduceCoalescedOptions()) override;
  /// As allreduce on the root; other ranks' tensors are left unchanged.
  c10::intrusive_ptr<c10d::Work> reduce(std::vector<at::Tensor>& tensors,
                                        const c10d::ReduceOptions& opts = c10d::ReduceOptions()) override;
  /// outputs[i][j] = inputs[i] for every rank j.
  c10::intrusive_ptr<c10d::Work> allgather(std::vector<std::vector<at::Tensor>>& outputs,
                                           std::vector<at::Tensor>& inputs,
                                           const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// Every size-th chunk of `output` = `input` (recorded as "allgather_base").
  c10::intrusive_ptr<c10d::Work> _allgather_base(
      at::Tensor& output, at::Tensor& input, const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// outputs[k][i] = inputs[i] for every list k (deprecated in c10d; kept for completeness).
  c10::intrusive_ptr<c10d::Work> allgather_coalesced(
      std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// _allgather_base for each (outputs[i], inputs[i]).
  c10::intrusive_ptr<c10d::Work> allgather_into_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::AllgatherOptions& opts = c10d::AllgatherOptions()) override;
  /// On the root, outputs[0][j] = inputs[0] for every rank j.
  c10::intrusive_ptr<c10d::Work> gather(std::vector<std::vector<at::Tensor>>& outputs, std::vector<at::Tensor>& inputs,
                                        const c10d::GatherOptions& opts = c10d::GatherOptions()) override;
  /// outputs[0] = inputs[0][rank] on the root; unchanged elsewhere (the root's list is unknown).
  c10::intrusive_ptr<c10d::Work> scatter(std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
                                         const c10d::ScatterOptions& opts = c10d::ScatterOptions()) override;
  /// outputs[i] = inputs[i][rank] reduced over `size` identical ranks.
  c10::intrusive_ptr<c10d::Work> reduce_scatter(
      std::vector<at::Tensor>& outputs, std::vector<std::vector<at::Tensor>>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// output = chunk [rank] of input, reduced (recorded as "reduce_scatter_base").
  c10::intrusive_ptr<c10d::Work> _reduce_scatter_base(
      at::Tensor& output, at::Tensor& input,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// _reduce_scatter_base for each (outputs[i], inputs[i]).
  c10::intrusive_ptr<c10d::Work> reduce_scatter_tensor_coalesced(
      std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
      const c10d::ReduceScatterOptions& opts = c10d::ReduceScatterOptions()) override;
  /// Every output slot j = this rank's input slot [rank] (what identical ranks send it).
  c10::intrusive_ptr<c10d::Work> alltoall_base(at::Tensor& output, at::Tensor& input,
                                               std::vector<int64_t>& output_splits, std::vector<int64_t>& input_splits,
                                               const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  /// outputs[j] = inputs[rank] for every j.
  c10::intrusive_ptr<c10d::Work> alltoall(std::vector<at::Tensor>& outputs, std::vector<at::Tensor>& inputs,
                                          const c10d::AllToAllOptions& opts = c10d::AllToAllOptions()) override;
  /// Records the send; the tensors are not read.
  c10::intrusive_ptr<c10d::Work> send(std::vector<at::Tensor>& tensors, int dst, int tag) override;
  /// Records the receive and zero-fills the tensors (a fresh torch::empty stays finite).
  c10::intrusive_ptr<c10d::Work> recv(std::vector<at::Tensor>& tensors, int src, int tag) override;
  /// As recv, recorded as "recv_anysource"; the work's sourceRank() is (rank + 1) % size.
  c10::intrusive_ptr<c10d::Work> recvAnysource(std::vector<at::Tensor>& tensors, int tag) override;
  /// Records "barrier".
  c10::intrusive_ptr<c10d::Work> barrier(const c10d::BarrierOptions& opts = c10d::BarrierOptions()) override;
  /// Records "monitored_barrier".
  void monitoredBarrier(const c10d::BarrierOptions& opts, bool wait_all_ranks = false) override;

 private:
  void record(RecordedOp op);

  std::string label_;
  mutable std::mutex mutex_;
  std::vector<RecordedOp> ops_;
};

/// The ops as compact text, one per line ("allreduce SUM 5792", "send ->1 tag 0 96",
/// "recv <-0 tag 1 96", "barrier"), for readable test failures.
std::string ops_text(const std::vector<RecordedOp>& ops);

}  // namespace gradcert
