// One bug-class catalog (backends/python/testbed/bugs.json): every class the C++ tables name
// (built-in mutants, diagnosis candidates) is in it and says it applies there, and the other
// way round; the adapters' catalog offers only the catalog's adapter classes. Python reads the
// same file (backends/python/testbed/mutants.py, MUTANTS).
#include <gtest/gtest.h>

#include <fstream>
#include <set>
#include <string>

#include <nlohmann/json.hpp>

#include "backends/runtime/mutants.hpp"
#include "conformance/checks/diagnosis.hpp"

namespace gradcert {
namespace {

nlohmann::json read_json(const std::string& rel) {
  std::ifstream in(std::string(GRADCERT_SOURCE_DIR) + "/" + rel);
  EXPECT_TRUE(in.good()) << rel;
  return nlohmann::json::parse(in);
}

std::set<std::string> catalog_where(const std::string& where) {
  std::set<std::string> out;
  const nlohmann::json catalog = read_json("backends/python/testbed/bugs.json");
  for (const auto& b : catalog.at("bugs"))
    for (const auto& a : b.at("applies"))
      if (a == where) out.insert(b.at("name").get<std::string>());
  return out;
}

TEST(BugCatalog, NamesEachClassOnce) {
  std::set<std::string> seen;
  const nlohmann::json catalog = read_json("backends/python/testbed/bugs.json");
  for (const auto& b : catalog.at("bugs")) {
    const std::string n = b.at("name");
    EXPECT_TRUE(seen.insert(n).second) << n << " is named twice";
    EXPECT_FALSE(b.at("what").get<std::string>().empty()) << n;
    EXPECT_FALSE(b.at("applies").empty()) << n << " applies nowhere";
  }
}

TEST(BugCatalog, BuiltInMutantsAreTheCatalogsBuiltinClasses) {
  std::set<std::string> table;
  for (const auto& m : mutant_table()) table.insert(m.name);
  EXPECT_EQ(table, catalog_where("builtin"));
}

TEST(BugCatalog, DiagnosisCandidatesAreTheCatalogsDiagnosisClasses) {
  std::set<std::string> table;
  for (const auto& c : objective_candidates()) table.insert(c.id);
  EXPECT_EQ(table, catalog_where("diagnosis"));
}

TEST(BugCatalog, AdaptersOfferOnlyTheCatalogsAdapterClasses) {
  const auto classes = catalog_where("adapter");
  const nlohmann::json adapters = read_json("backends/python/adapters.json");
  for (const auto& a : adapters.at("adapters"))
    for (const auto& m : a.at("mutants"))
      EXPECT_TRUE(classes.count(m.get<std::string>())) << a.at("name") << " offers " << m << ", not an adapter class";
}

TEST(BugCatalog, TheOldNameOfDividedByDTwiceStillParses) {
  EXPECT_EQ(parse_mutant("shard-divide-factor"), parse_mutant("divided-by-d-twice"));
}

}  // namespace
}  // namespace gradcert
