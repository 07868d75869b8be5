// The libFuzzer entry point every fuzz target defines (conformance/fuzz/README.md).
#pragma once
#include <cstddef>
#include <cstdint>

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size);
