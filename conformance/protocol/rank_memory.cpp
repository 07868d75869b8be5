// rank<r>.memory.json: what a built-in rank measured of its memory (artifacts.hpp, RankMemory).
#include "conformance/protocol/artifacts.hpp"

#include "conformance/core/files.hpp"
#include "conformance/core/strict_json.hpp"
#include "conformance/protocol/fields.hpp"

#include <nlohmann/json.hpp>

namespace gradcert {

using nlohmann::json;

void write_rank_memory(const std::string& dir, const RankMemory& m) {
  json peaks = json::array();
  for (const auto& p : m.peaks)
    peaks.push_back({{"bucket", p.bucket},
                     {"phase", p.phase},
                     {"device", p.device},
                     {"peak_bytes", p.peak_bytes},
                     {"current_bytes", p.current_bytes},
                     {"seconds", p.seconds},
                     {"process_high_water_bytes", p.process_high_water_bytes}});
  json j = {{"schema", "gradcert.memory/1"},
            {"rank", m.rank},
            {"model_state_bytes", m.model_state_bytes},
            {"model_state_tensors", m.model_state_tensors},
            {"checkpoint_bytes", m.checkpoint_bytes},
            {"process_high_water_bytes", m.process_high_water_bytes},
            {"peaks", peaks}};
  write_file_atomic(dir + "/rank" + std::to_string(m.rank) + ".memory.json", j.dump(1));
}

RankMemory read_rank_memory(const std::string& dir, int rank) {
  const std::string path = dir + "/rank" + std::to_string(rank) + ".memory.json";
  const json j = parse_artifact_json(read_text_file(path), path);
  const Fields f{j, path};
  f.schema("gradcert.memory/1");
  RankMemory m;
  m.rank = static_cast<int>(f.integer("rank"));
  if (m.rank != rank) f.fail("rank " + std::to_string(m.rank) + ", expected " + std::to_string(rank));
  m.model_state_bytes = f.integer("model_state_bytes", -1, INT64_MAX);
  m.model_state_tensors = f.integer("model_state_tensors", 0, INT64_MAX);
  m.checkpoint_bytes = f.integer("checkpoint_bytes", 0, INT64_MAX);
  m.process_high_water_bytes = f.integer("process_high_water_bytes", -1, INT64_MAX);
  const json& peaks = f.at("peaks");
  if (!peaks.is_array()) f.fail("field 'peaks' is not an array");
  for (size_t i = 0; i < peaks.size(); ++i) {
    const Fields pf{peaks[i], path + ": peaks[" + std::to_string(i) + "]"};
    PhasePeak p;
    p.rank = rank;
    p.bucket = pf.string("bucket");
    p.phase = pf.string("phase");
    p.device = pf.string("device");
    p.peak_bytes = pf.integer("peak_bytes", INT64_MIN, INT64_MAX);
    p.current_bytes = pf.integer("current_bytes", INT64_MIN, INT64_MAX);
    p.seconds = pf.number("seconds");
    p.process_high_water_bytes = pf.integer("process_high_water_bytes", INT64_MIN, INT64_MAX);
    m.peaks.push_back(p);
  }
  return m;
}

}  // namespace gradcert
