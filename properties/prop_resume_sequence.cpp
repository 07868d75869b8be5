// Property 7: step / save / reshard / resume sequences (rc::state). The system trains a small
// state (two parameters and their SGD momentum) and may save it as a checkpoint of any world,
// each tensor cut into random row-major pieces on random ranks (NOTE [checkpoint format]), then
// resume from the last save; the model is the same training with no checkpoint at all (the
// reference's trajectory). After every command the system's state is the model's, bit for bit:
// any sequence of saves, reshards and resumes reproduces training exactly. A planted save bug
// (one element one ulp off on the way to disk) is shrunk by rapidcheck to its two-command core.
#include <gtest/gtest.h>
#include <rapidcheck/gtest.h>
#include <rapidcheck/state.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <map>

#include <unistd.h>

#include "conformance/protocol/artifacts.hpp"
#include "conformance/protocol/checkpoint.hpp"

using namespace gradcert;

namespace {

using State = std::map<std::string, std::vector<double>>;  // checkpoint name -> values

const char* kNonce = "0123456789abcdef0123456789abcdef";
const OptimizerSpec& momentum_sgd() {
  static const OptimizerSpec o = [] {
    OptimizerSpec s;
    s.name = "sgd";
    s.lr = 0.1;
    s.momentum = 0.9;
    return s;
  }();
  return o;
}
TensorMap shapes() {
  TensorMap t;
  for (auto [name, shape] : {std::pair<const char*, std::vector<int64_t>>{"a", {2, 3}}, {"b", {4}}}) {
    t[name].name = name;
    t[name].shape = shape;
  }
  return t;
}
std::map<std::string, TensorExpectation> expectation() {
  return checkpoint_expectation(shapes(), momentum_sgd(), DType::Float64);
}

State initial_state() {
  State s;
  for (const auto& [name, e] : expectation()) {
    int64_t n = 1;
    for (int64_t d : e.shape) n *= d;
    for (int64_t i = 0; i < n; ++i) s[name].push_back(name.rfind("param.", 0) == 0 ? 0.25 * double(i) - 0.5 : 0.0);
  }
  return s;
}

// One SGD-with-momentum update u (the protocol's rule: m = mu m + g, p -= lr m) on a gradient
// that is a fixed function of the update, the tensor and the element.
void train_step(State& s, int u) {
  const OptimizerSpec& o = momentum_sgd();
  for (const auto& [name, t] : shapes()) {
    auto& p = s["param." + name];
    auto& m = s["optim." + name + ".m"];
    for (size_t i = 0; i < p.size(); ++i) {
      const double g = std::sin(1.3 * u + 0.7 * double(i) + double(name[0])) + 0.01 * p[i];
      m[i] = o.momentum * m[i] + g;
      p[i] -= o.lr * m[i];
    }
  }
}

struct Model {
  State live = initial_state(), saved;
  int updates = 0, saved_updates = -1;
};

// The system under test: a state that lives in memory and goes to disk and back.
struct System {
  State live = initial_state();
  int updates = 0;
  std::string dir;
  int commands = 0;  // run in this sequence
};

bool g_plant_ulp = false;  // the planted save bug: one element one ulp off on disk (the shrink test)
int g_shortest_failure = 1 << 30;

void expect_same(const Model& m, const System& s, const std::string& after) {
  for (const auto& [name, v] : m.live) {
    const auto& w = s.live.at(name);
    for (size_t i = 0; i < v.size(); ++i)
      if (std::memcmp(&v[i], &w[i], sizeof(double)) != 0) {
        g_shortest_failure = std::min(g_shortest_failure, s.commands);
        RC_FAIL("after " + after + ": " + name + "[" + std::to_string(i) + "] is " + std::to_string(w[i]) +
                ", the model's " + std::to_string(v[i]));
      }
  }
  RC_ASSERT(s.updates == m.updates);
}

struct Step : rc::state::Command<Model, System> {
  void apply(Model& m) const override { train_step(m.live, m.updates++); }
  void run(const Model& m, System& s) const override {
    ++s.commands;
    train_step(s.live, s.updates++);
    Model next = m;
    apply(next);
    expect_same(next, s, "step");
  }
  void show(std::ostream& os) const override { os << "Step"; }
};

// Save the system's state as a checkpoint of `world` ranks: every tensor cut at random points
// into row-major pieces, each on a random rank.
struct Save : rc::state::Command<Model, System> {
  int world = *rc::gen::inRange(1, 5).as("world");
  std::vector<int64_t> cuts = *rc::gen::container<std::vector<int64_t>>(rc::gen::inRange<int64_t>(0, 64)).as("cuts");
  std::vector<int> owners = *rc::gen::container<std::vector<int>>(rc::gen::inRange(0, 4)).as("owners");

  void apply(Model& m) const override { m.saved = m.live, m.saved_updates = m.updates; }
  void run(const Model& m, System& s) const override {
    ++s.commands;
    namespace fs = std::filesystem;
    fs::remove_all(s.dir);
    fs::create_directories(s.dir);
    std::vector<std::vector<ShardPiece>> files(world);
    size_t k = 0;
    for (const auto& [name, v] : s.live) {
      std::vector<int64_t> at = {0, static_cast<int64_t>(v.size())};
      for (int64_t c : cuts) at.push_back(1 + c % std::max<int64_t>(int64_t(v.size()) - 1, 1));
      std::sort(at.begin(), at.end());
      at.erase(std::unique(at.begin(), at.end()), at.end());
      for (size_t i = 0; i + 1 < at.size(); ++i, ++k) {
        ShardPiece p;
        p.tensor = name;
        p.shape = expectation().at(name).shape;
        p.flat_begin = at[i];
        p.data.name = name;
        p.data.shape = {at[i + 1] - at[i]};
        p.data.held.assign(v.begin() + at[i], v.begin() + at[i + 1]);
        if (g_plant_ulp && name == "param.b" && i == 0) p.data.held[0] = std::nextafter(p.data.held[0], 1e300);
        files[owners.empty() ? 0 : owners[k % owners.size()] % world].push_back(std::move(p));
      }
    }
    for (int r = 0; r < world; ++r) write_placed_file(s.dir + "/" + checkpoint_file(r), files[r], {});
    write_checkpoint_record(s.dir, {"prop", world, s.updates, s.updates, 0, 0, kNonce});
    expect_same(m, s, "save");  // saving does not change the live state
  }
  void show(std::ostream& os) const override { os << "Save(world " << world << ", " << cuts.size() << " cuts)"; }
};

// Resume from the last save in another process group: the checkpoint read whole, whatever the
// world that saved it (the reshard), and training continues from it.
struct Resume : rc::state::Command<Model, System> {
  void checkPreconditions(const Model& m) const override { RC_PRE(m.saved_updates >= 0); }
  void apply(Model& m) const override { m.live = m.saved, m.updates = m.saved_updates; }
  void run(const Model& m, System& s) const override {
    ++s.commands;
    const Checkpoint cp = read_checkpoint(s.dir, 0, expectation(), kNonce);
    s.updates = cp.record.updates_done;
    for (const auto& [name, t] : cp.tensors) {
      const TensorValues v = t.read();
      s.live[name].assign(v.begin(), v.end());
    }
    Model next = m;
    apply(next);
    expect_same(next, s, "resume");
  }
  void show(std::ostream& os) const override { os << "Resume"; }
};

std::string scratch() {
  namespace fs = std::filesystem;
  const fs::path d = fs::temp_directory_path() / ("gradcert_prop_resume_" + std::to_string(::getpid()));
  static const bool cleanup = [] {
    std::atexit([] {
      std::error_code ec;
      fs::remove_all(fs::temp_directory_path() / ("gradcert_prop_resume_" + std::to_string(::getpid())), ec);
    });
    return true;
  }();
  (void)cleanup;
  return d.string();
}

void run_sequence() {
  System s;
  s.dir = scratch();
  rc::state::check(Model{}, s, rc::state::gen::execOneOfWithArgs<Step, Save, Resume>());
}

}  // namespace

RC_GTEST_PROP(ResumeSequence, anyStepSaveReshardResumeSequenceReproducesTheModelBitForBit, ()) { run_sequence(); }

// The property is not vacuous: with a save that moves one element by one ulp, it fails, and
// rapidcheck shrinks the failing sequence to Save, Resume (the shortest that reaches the bug).
TEST(ResumeSequence, aPlantedSaveBugIsFoundAndShrunkToTwoCommands) {
  g_plant_ulp = true;
  g_shortest_failure = 1 << 30;
  const bool held = rc::check("resume sequences with a planted save bug", [] { run_sequence(); });
  g_plant_ulp = false;
  EXPECT_FALSE(held);
  EXPECT_EQ(g_shortest_failure, 2) << "the shortest failing sequence rapidcheck reached";
}
