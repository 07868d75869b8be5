// Numbers and text as every writer prints them (tables, Markdown, JSON, XML).
#pragma once
#include <nlohmann/json_fwd.hpp>

#include <string>

namespace gradcert {

/// A figure as the tables print it: integers plainly, others as %.2e; inf and nan by name.
std::string figure_text(double x);
/// Three significant digits ("%.3g"): a figure inside a sentence.
std::string g3_text(double x);
/// A double for JSON: non-finite values become the strings "nan", "inf", "-inf".
nlohmann::json json_number(double x);
/// A word as a POSIX shell reads it back: as it is when safe, else in single quotes.
std::string shell_word(const std::string& s);
/// Text escaped for XML attributes and content (control characters become spaces).
std::string xml_escape(const std::string& s);
/// A number with every significant digit a double holds (%.15g): recipes, formulas.
std::string exact_text(double x);
/// "8.94 GiB", "3.20 MiB", "512 B" (binary units, 2 decimals above 1 KiB).
std::string human_bytes(double bytes);
/// A user's text inside a message: quoted whole up to `max` characters, else its first `max`
/// characters and its length ("'abc...' (104857600 bytes)"), so no input is echoed at length.
std::string quoted_excerpt(const std::string& s, size_t max = 60);
/// Scientific form, trailing zeros dropped, up to 5 significant digits: 9.6e9, 1.284e9, 5.792e3.
std::string sci(double x);

}  // namespace gradcert
