// Torch-free unit tests of the estimator, the layout, the audit's comparison and the number
// formatting (this executable does not link LibTorch: NOTE [layers] in CMakeLists.txt).
#include <gtest/gtest.h>

#include "conformance/audit/compare.hpp"
#include "conformance/core/format.hpp"
#include "conformance/layout/layout.hpp"
#include "conformance/memory/memory.hpp"
#include "conformance/protocol/inputs.hpp"

using namespace gradcert;

TEST(TorchFreeEstimate, SeedWorkedExample) {
  EstimateInput in;
  in.params = 600000000;
  const MemoryEstimate e = estimate_memory(in);  // mixed-adam by default: 16 B/param
  EXPECT_EQ(e.model_state(), 9600000000);
  EXPECT_NE(estimate_text(e).find("model state: 9.6e9 B = 8.94 GiB (9600000000 B)"), std::string::npos);
  in.strategy = Sharding::ZeRO3;
  in.world = 4;
  EXPECT_EQ(estimate_memory(in).model_state(), 2400000000);
}

TEST(TorchFreeLayout, CountsFollowTheParameterTable) {
  const ModelSpec m;
  const auto layout = tiny_lm_layout(m);
  int64_t total = 0, split = 0;
  for (const auto& p : layout) {
    total += p.numel;
    if (p.tp != TpSplit::Replicated) split += p.numel;
  }
  const TinyLMCounts c = tiny_lm_counts(m);
  EXPECT_EQ(c.total, total);
  EXPECT_EQ(c.total, 5792);
  EXPECT_EQ(c.tp_split, split);
  EXPECT_EQ(fsdp_unit_of("blocks.1.fc.bias"), "blocks.1");
  EXPECT_EQ(fsdp_unit_of("wpe.weight"), "embed");
  EXPECT_EQ(fsdp_unit_of("ln_f.weight"), "head");
  EXPECT_EQ(tp_split_of("blocks.0.qkv.weight"), TpSplit::ColumnQkv);
  EXPECT_EQ(tp_split_of("blocks.0.proj.bias"), TpSplit::Replicated);
  EXPECT_EQ(stage_blocks(3, 2, 0), (std::pair<int, int>{0, 1}));
  EXPECT_EQ(stage_blocks(3, 2, 1), (std::pair<int, int>{1, 3}));
  EXPECT_EQ(c.stage(2, 0) + c.stage(2, 1), c.total);
}

TEST(TorchFreeCompare, NamesTheTensorAndUpdateThatDiffer) {
  Spec spec;
  spec.updates = 1;
  const Plan plan = make_plan(spec);
  BackendUpdate u;
  u.update = 0;
  u.loss = 1.5;
  u.valid_targets = 40;
  u.grads["w"] = HostTensor{"w", {2}, {1.0, 2.0}};
  u.params_after["w"] = HostTensor{"w", {2}, {0.5, 0.5}};
  const std::vector<BackendUpdate> before = {u};
  EXPECT_TRUE(compare_runs(plan, before, before, 1e-10).differences.empty());
  BackendUpdate v = u;
  v.grads["w"].held[1] = 2.5;
  const auto cmp = compare_runs(plan, before, {v}, 1e-10);
  ASSERT_EQ(cmp.diffs.size(), 1u);
  EXPECT_GT(cmp.diffs[0].grad_rel, 0.2);
  ASSERT_FALSE(cmp.differences.empty());
  EXPECT_NE(cmp.differences.back().find("gradients differ between the two sides: worst update 0 w"), std::string::npos)
      << cmp.differences.back();
}

TEST(TorchFreeFormat, FiguresAndBytes) {
  EXPECT_EQ(figure_text(3), "3");
  EXPECT_EQ(figure_text(1.25e-15), "1.25e-15");
  EXPECT_EQ(human_bytes(9.6e9), "8.94 GiB");
  EXPECT_EQ(human_bytes(512), "512 B");
  EXPECT_EQ(sci(5792), "5.792e3");
  EXPECT_EQ(xml_escape("a<b&\"c\""), "a&lt;b&amp;&quot;c&quot;");
}

TEST(TorchFreeProtocol, PlanJsonReadsBackAsThePlan) {
  for (int dp : {1, 2, 3}) {
    Spec spec;
    spec.topology.dp = dp;
    spec.updates = 7;  // across an epoch boundary
    const Plan p = make_plan(spec);
    Spec read_spec;
    const Plan q = parse_plan_json(plan_to_json(p, spec), "plan.json", &read_spec);
    EXPECT_EQ(spec_to_json(read_spec), spec_to_json(spec));
    ASSERT_EQ(q.windows.size(), p.windows.size());
    EXPECT_EQ(q.update_batch, p.update_batch);
    for (size_t u = 0; u < p.windows.size(); ++u) {
      const Window &a = p.windows[u], &b = q.windows[u];
      EXPECT_EQ(b.ids, a.ids);
      EXPECT_EQ(b.valid_targets, a.valid_targets);
      EXPECT_EQ(b.partial, a.partial);
      EXPECT_EQ(b.epoch, a.epoch);
      EXPECT_EQ(b.index_in_epoch, a.index_in_epoch);
      for (int r = 0; r < p.dp; ++r)
        for (int k = 0; k < p.accum; ++k) {
          EXPECT_EQ(b.slots[r][k].ids, a.slots[r][k].ids);
          EXPECT_EQ(b.slots[r][k].input_tokens, a.slots[r][k].input_tokens);
          EXPECT_EQ(b.slots[r][k].valid_targets, a.slots[r][k].valid_targets);
        }
    }
  }
}

TEST(TorchFreeProtocol, PlanJsonErrorsNameTheField) {
  Spec spec;
  std::string text = plan_to_json(make_plan(spec), spec);
  const auto at = text.find("\"input_tokens\": ");
  ASSERT_NE(at, std::string::npos);
  text.replace(at, std::string("\"input_tokens\": ").size(), "\"input_tokens\": \"x\", \"was\": ");
  try {
    (void)parse_plan_json(text, "plan.json");
    FAIL() << "accepted a string token count";
  } catch (const ArtifactError& e) {
    EXPECT_NE(std::string(e.what()).find("plan.json: windows[0].slots[0][0].input_tokens: expected an integer"),
              std::string::npos)
        << e.what();
  }
}
