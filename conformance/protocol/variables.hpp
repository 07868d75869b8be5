// The protocol's environment variables (backends/PROTOCOL.md): what gradcert sets for a stack's
// command, an observed job and its own rank processes. Declared once here; the harness, observe
// and the worker use these names, the Python side (gradcert.ref.client, gradcert.observe) reads
// the same strings. The launcher's GRADCERT_RANK / GRADCERT_WORLD / GRADCERT_NO_ZYGOTE are the
// launch layer's own (conformance/launch, below this layer) and stay there.
#pragma once

namespace gradcert::vars {

// A stack's command (--backend external): where its run folder and inputs are.
inline constexpr const char* kRunDir = "GRADCERT_RUN_DIR";
inline constexpr const char* kPlan = "GRADCERT_PLAN";
inline constexpr const char* kDataset = "GRADCERT_DATASET";
inline constexpr const char* kInit = "GRADCERT_INIT";
inline constexpr const char* kOut = "GRADCERT_OUT";
inline constexpr const char* kNproc = "GRADCERT_NPROC";
inline constexpr const char* kMasterPort = "GRADCERT_MASTER_PORT";
inline constexpr const char* kSampler = "GRADCERT_SAMPLER";     ///< "plan" | "own" (--sampler-audit)
inline constexpr const char* kDevice = "GRADCERT_DEVICE";       ///< "cpu" | "cuda" (NOTE [device])
inline constexpr const char* kRunNonce = "GRADCERT_RUN_NONCE";  ///< NOTE [run nonce]
// A resumed run's legs (NOTE [resume]).
inline constexpr const char* kSaveAt = "GRADCERT_SAVE_AT";
inline constexpr const char* kSaveDir = "GRADCERT_SAVE_DIR";
inline constexpr const char* kResumeFrom = "GRADCERT_RESUME_FROM";
// An observed job (gradcert observe).
inline constexpr const char* kObserveDir = "GRADCERT_OBSERVE_DIR";
inline constexpr const char* kObserveUpdates = "GRADCERT_OBSERVE_UPDATES";
inline constexpr const char* kObserveKeepDropout = "GRADCERT_OBSERVE_KEEP_DROPOUT";
// gradcert's own: the checkout (python_reference.cpp) and a planted rank fault (tests).
inline constexpr const char* kRoot = "GRADCERT_ROOT";
inline constexpr const char* kFault = "GRADCERT_FAULT";

}  // namespace gradcert::vars
