#include "conformance/core/memory_types.hpp"

#include "conformance/core/format.hpp"

#include <cstdio>
#include <sstream>
#include <stdexcept>

namespace gradcert {

std::string Recipe::breakdown() const {
  std::ostringstream o;
  const std::pair<double, const std::string*> parts[] = {{bytes.weight_bytes, &weight_label},
                                                         {bytes.grad_bytes, &grad_label},
                                                         {bytes.master_bytes, &master_label},
                                                         {bytes.moment_bytes, &moment_label}};
  bool first = true;
  for (const auto& [b, label] : parts) {
    if (b == 0) continue;
    o << (first ? "" : " + ") << exact_text(b) << " (" << *label << ")";
    first = false;
  }
  o << " = " << exact_text(per_param()) << " B/param";
  return o.str();
}

std::string sharding_name(Sharding s) {
  switch (s) {
    case Sharding::Single: return "single";
    case Sharding::DDP: return "ddp";
    case Sharding::ZeRO1: return "zero1";
    case Sharding::ZeRO2: return "zero2";
    case Sharding::ZeRO3: return "zero3";
    case Sharding::FSDP: return "fsdp";
    case Sharding::TP: return "tp";
    case Sharding::PP: return "pp";
  }
  return "single";
}

Sharding parse_sharding(const std::string& name) {
  for (auto s : {Sharding::Single, Sharding::DDP, Sharding::ZeRO1, Sharding::ZeRO2, Sharding::ZeRO3, Sharding::FSDP,
                 Sharding::TP, Sharding::PP})
    if (sharding_name(s) == name) return s;
  throw std::invalid_argument("unknown strategy '" + name +
                              "' (known: single, ddp, zero1, zero2, zero3, fsdp, tp, pp)");
}

}  // namespace gradcert
