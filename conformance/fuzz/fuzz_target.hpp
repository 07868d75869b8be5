// The libFuzzer entry point every fuzz target defines (docs/testing.md, Fuzzing and sanitizers).
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
