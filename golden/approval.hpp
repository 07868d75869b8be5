// Approval testing for goldens: normalised text compared with an approved file; a mismatch
// writes <name>.unapproved.txt beside it, prints a diff and fails. Torch-free.
#pragma once
#include <gtest/gtest.h>

#include <string>

namespace gradcert::golden {

/// The folder holding <name>.golden.txt (the source tree's golden/).
std::string golden_dir();

/// Replaces volatile parts with placeholders: absolute paths -> <path>, ISO date-times ->
/// <time>, dotted versions (1.2.3...) -> <version>.
std::string mask_volatile(const std::string& text);

/// Line-by-line, token-by-token equality of two masked texts, where tokens that are
/// floating-point numbers (with '.', 'e' or 'E') agree within `relative` (see NOTE
/// [golden numbers] in approval.cpp) and every other token must match exactly. On a
/// mismatch, `diff` receives a unified-style listing of the differing lines.
bool texts_agree(const std::string& approved, const std::string& actual, double relative, std::string* diff);

/// Compares `actual` (masked first) with golden/<name>.golden.txt. On a mismatch or when
/// no golden exists yet, writes golden/<name>.unapproved.txt, prints the diff and fails
/// with the command that approves it. On a match, removes a stale unapproved file.
::testing::AssertionResult matches_golden(const std::string& name, const std::string& actual, double relative = 1e-10);

}  // namespace gradcert::golden
