#include "conformance/core/strict_json.hpp"

#include <set>
#include <vector>

#include "conformance/core/tensors.hpp"

namespace gradcert {

using nlohmann::json;

// NOTE [strict json] nlohmann keeps the last of two equal keys and nests without limit;
// its dump() and copies recurse, so a value nested 100k deep crashes the process. Every
// reader of a file a user or a stack wrote (spec, plan, manifest, rank records, the
// safetensors header) parses through parse_json_strict, which follows the parse with a
// callback: one frame per open object or array, the keys each object has seen, and the
// path to the current value for the message. Messages echo values via json_excerpt only.

namespace {

struct Frame {
  bool object = false;
  std::set<std::string> keys;
  std::string key;  // object: the current member
  long index = -1;  // array: the current element
};

struct Stop {};  // thrown out of the callback; the problem is already recorded

std::string path_of(const std::vector<Frame>& frames) {
  std::string p;
  for (const auto& f : frames) {
    if (f.object && !f.key.empty())
      p += (p.empty() ? "" : ".") + (f.key.size() > 60 ? f.key.substr(0, 60) + "..." : f.key);
    if (!f.object && f.index >= 0) p += "[" + std::to_string(f.index) + "]";
  }
  // At the depth limit the path is ~64 levels long: keep its start (where it went wrong).
  return p.size() > 100 ? p.substr(0, 80) + "..." : p;
}

void excerpt(const json& v, std::string& out, size_t cap, int depth) {
  if (out.size() > cap) return;
  if (v.is_object() || v.is_array()) {
    if (depth >= kMaxJsonDepth) {
      out += v.is_object() ? "{...}" : "[...]";
      return;
    }
    const bool obj = v.is_object();
    out += obj ? '{' : '[';
    bool first = true;
    for (auto it = v.begin(); it != v.end() && out.size() <= cap; ++it) {
      if (!first) out += ',';
      first = false;
      if (obj) out += json(it.key().substr(0, cap)).dump(-1, ' ', false, json::error_handler_t::replace) + ':';
      excerpt(it.value(), out, cap, depth + 1);
    }
    out += obj ? '}' : ']';
    return;
  }
  if (v.is_string()) {
    const auto& s = v.get_ref<const std::string&>();
    // error_handler replace: a cut may split a UTF-8 sequence.
    out += json(s.substr(0, cap + 1)).dump(-1, ' ', false, json::error_handler_t::replace);
    return;
  }
  out += v.dump();
}

}  // namespace

std::optional<JsonProblem> parse_json_strict(const std::string& text, json& out, int max_depth) {
  std::vector<Frame> frames;
  JsonProblem problem;
  auto enter_value = [&] {
    if (!frames.empty() && !frames.back().object) ++frames.back().index;
  };
  json::parser_callback_t cb = [&](int, json::parse_event_t event, json& parsed) -> bool {
    switch (event) {
      case json::parse_event_t::object_start:
      case json::parse_event_t::array_start: {
        enter_value();
        if (static_cast<int>(frames.size()) >= max_depth) {
          problem = {JsonProblem::Kind::TooDeep, path_of(frames), "",
                     "nested deeper than " + std::to_string(max_depth) + " levels"};
          throw Stop{};
        }
        Frame f;
        f.object = event == json::parse_event_t::object_start;
        frames.push_back(std::move(f));
        break;
      }
      case json::parse_event_t::key: {
        Frame& f = frames.back();
        const std::string k = parsed.is_string() ? parsed.get<std::string>() : parsed.dump();
        f.key = k;
        if (!f.keys.insert(k).second) {
          const std::string shown = k.size() > 60 ? k.substr(0, 60) + "..." : k;
          problem = {JsonProblem::Kind::DuplicateKey, path_of(frames), k,
                     "duplicate key '" + shown + "' (the last would silently win)"};
          throw Stop{};
        }
        break;
      }
      case json::parse_event_t::object_end:
      case json::parse_event_t::array_end:
        if (!frames.empty()) frames.pop_back();
        break;
      case json::parse_event_t::value: enter_value(); break;
    }
    return true;
  };
  try {
    out = json::parse(text, cb, /*allow_exceptions=*/true);
  } catch (const Stop&) {
    out = json();
    return problem;
  } catch (const json::out_of_range& e) {  // 406: a number beyond double's range
    return JsonProblem{JsonProblem::Kind::NumberRange, path_of(frames), "",
                       std::string("number out of range (") + e.what() + ")"};
  } catch (const json::exception& e) {
    // nlohmann quotes the last token it read: an unterminated string could echo a whole file.
    std::string why = e.what();
    if (why.size() > 200) why = why.substr(0, 200) + "...";
    return JsonProblem{JsonProblem::Kind::Syntax, "", "", "not valid JSON: " + why};
  }
  return std::nullopt;
}

json parse_artifact_json(const std::string& text, const std::string& source) {
  json j;
  if (auto p = parse_json_strict(text, j)) throw ArtifactError(source + ": " + p->message());
  return j;
}

std::string json_excerpt(const json& v, size_t max_chars) {
  std::string out;
  excerpt(v, out, max_chars, 0);
  if (out.size() > max_chars) out = out.substr(0, max_chars) + "...";
  return out;
}

}  // namespace gradcert
