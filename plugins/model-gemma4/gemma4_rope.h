/*
 * gemma4_rope.h — RoPE frequency tables (spec gemma4.md §3.4), computed in fp32 the way torch does.
 */
#ifndef BERTH_GEMMA4_ROPE_H
#define BERTH_GEMMA4_ROPE_H

#include "gemma4_config.h"

/* Rotated pairs of a head of dim d under ro: d/2 for "default", floor(prf*d/2) for "proportional". */
int g4_rope_pairs(const struct g4_rope *ro, int d);

/* Write the g4_rope_pairs(ro, d) non-zero frequencies to freqs (the proportional table's zero tail is not
 * stored: those dims pass through, which ROPE/KV_APPEND do for dims outside n_pairs). Returns that count. */
int g4_rope_freqs(const struct g4_rope *ro, int d, float *freqs);

#endif
