// Included first by every quant/*.cpp: the references must round after each multiply and add, as
// ggml's reference code and numpy do, so fused multiply-add contraction is switched off for the
// rest of the including file (GCC contracts across statements by default when FMA is available).
#pragma once

#if defined(__clang__)
#pragma clang fp contract(off)
#elif defined(__GNUC__)
#pragma GCC optimize("fp-contract=off")
#endif
