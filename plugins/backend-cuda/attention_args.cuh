/*
 * attention_args.cuh — host side: the fields every attention kernel's argument struct takes from
 * berth_attention_params the same way (device addresses and byte strides of q, out, gate, the sequence metadata,
 * the block table and the paged K/V view; mask, window, scale, softcap), filled once for attention.cu,
 * attention_prefill.cu, attention_decode.cu and attention_decode_mma.cu. A: any of their argument structs (the
 * field names are shared; each file sets its own remaining fields); and BERTH_CUDA_ATT_PROF's stamp helpers, shared
 * by the two decode kernels.
 */
#ifndef BERTH_CUDA_ATTENTION_ARGS_CUH
#define BERTH_CUDA_ATTENTION_ARGS_CUH

#include "cuda_internal.h"

#include <stdint.h>

/* BERTH_CUDA_ATT_PROF=1 (a measurement switch, eager calls only; attention_decode_mma.cu defines these): the
 * stream's buffer for `stamps` global-timer stamps per block of a call of `blocks` blocks, zero; NULL when it cannot
 * be had (the call then runs without stamps). */
unsigned long long *cu_att_prof_buffer(berth_backend *be, berth_stream *s, int64_t blocks, int stamps);
/* After the stamped call: synchronise the stream (a fault of the call is reported here), log at WARN `what` and per
 * stamp the minimum / upper median / maximum over the blocks in us from the earliest block start, zero the stamps
 * for the next call. */
berth_status cu_att_prof_report(berth_backend *be, berth_stream *s, unsigned long long *prof, int blocks, int stamps,
                                const char *what);
/* BERTH_CUDA_ATT_PROF=graph, while a graph is captured: a region of the stream's arena for the stamps of this
 * launch (`what` names it in the report); NULL when not capturing in that mode or the arena is full. */
unsigned long long *cu_att_prof_graph(berth_backend *be, berth_stream *s, int64_t blocks, int stamps, const char *what);
/* The stamps of a launch about to be made, whichever way BERTH_CUDA_ATT_PROF asks: the stream's zeroed buffer in an
 * eager call with =1 (cu_att_prof_buffer; report it after the launch with cu_att_prof_report), a region of the
 * graph arena while capturing with =graph (cu_att_prof_graph), else NULL. */
unsigned long long *cu_att_prof_for(berth_backend *be, berth_stream *s, int64_t blocks, int stamps, const char *what);

/* Device side: thread 0 of the block records the global timer as stamp k of its `stamps` in prof (NULL: nothing). */
static __device__ __forceinline__ void cu_att_stamp(unsigned long long *prof, int stamps, int k)
{
    if (prof && threadIdx.x == 0) {
        unsigned long long t;
        asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t));
        prof[(size_t)blockIdx.x * stamps + k] = t;
    }
}

template <typename A>
static inline void cu_attn_args_fill(A &a, const berth_attention_params *p)
{
    const berth_kv_view *kv = &p->kv;
    const bool gate = p->gate.buf != nullptr;
    a.q = (decltype(a.q))cu_ptr(&p->q);
    a.q_nb1 = p->q.nb[1];
    a.q_nb2 = p->q.nb[2];
    a.out = cu_ptr(&p->out);
    a.out_nb1 = p->out.nb[1];
    a.out_nb2 = p->out.nb[2];
    a.gate = gate ? cu_ptr(&p->gate) : nullptr;
    a.gate_nb1 = gate ? p->gate.nb[1] : 0;
    a.gate_nb2 = gate ? p->gate.nb[2] : 0;
    a.positions = (const int32_t *)cu_ptr(&p->positions);
    a.seq_q_start = (const int32_t *)cu_ptr(&p->seq_q_start);
    a.seq_kv_len = (const int32_t *)cu_ptr(&p->seq_kv_len);
    a.block_table = (const int32_t *)cu_ptr(&p->block_table);
    a.bt_stride = p->block_table.nb[1] / (int64_t)sizeof(int32_t);
    a.bt_width = (int32_t)(p->block_table.ne[0] < INT32_MAX ? p->block_table.ne[0] : INT32_MAX);
    a.kbase = (const char *)kv->k_buf->ptr + kv->k_offset;
    a.vbase = (const char *)kv->v_buf->ptr + kv->v_offset;
    a.block_stride = (int64_t)kv->block_stride;
    a.token_stride = (int64_t)kv->token_stride;
    a.head_stride = (int64_t)kv->head_stride;
    a.v_token_stride = (int64_t)kv->v_token_stride;
    a.v_head_stride = (int64_t)kv->v_head_stride;
    a.block_size = kv->block_size;
    a.n_blocks = kv->n_blocks;
    a.mask = p->mask;
    a.window = p->mask == BERTH_MASK_CAUSAL ? p->window : 0;
    a.scale = p->scale;
    a.softcap = p->softcap;
}

/* log2(block_size) when it is a power of two, else -1 (the kernels' shift-or-divide choice). */
static inline int32_t cu_block_shift(int32_t block_size)
{
    for (int sh = 0; sh < 31; sh++)
        if (block_size == 1 << sh)
            return sh;
    return -1;
}

/* The paged view's K/V bases and strides are all 16-byte aligned (16-byte loads / cp.async allowed). */
static inline bool cu_kv_aligned16(const berth_kv_view *kv)
{
    const uint64_t align = (uintptr_t)((const char *)kv->k_buf->ptr + kv->k_offset) |
                           (uintptr_t)((const char *)kv->v_buf->ptr + kv->v_offset) | kv->block_stride |
                           kv->token_stride | kv->head_stride | kv->v_token_stride | kv->v_head_stride;
    return (align & 15u) == 0;
}

#endif
