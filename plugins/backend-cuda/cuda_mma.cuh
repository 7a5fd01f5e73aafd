/*
 * cuda_mma.cuh — device helpers of the tensor-core kernels (attention.cu, attention_prefill.cu): shared-memory
 * addresses, ldmatrix, the m16n8k16 bf16/f16 mma with fp32 accumulators, packing to the mma's input type,
 * cp.async, and what the prefill attention kernels share: the key range a query row sees and the tile a block
 * takes. sm_80+ PTX (the backend builds for sm_90).
 */
#ifndef BERTH_CUDA_MMA_CUH
#define BERTH_CUDA_MMA_CUH

#include <berth/backend.h>
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <stdint.h>

__device__ __forceinline__ uint32_t cu_smem_addr(const void *p)
{
    return (uint32_t)__cvta_generic_to_shared(p);
}

/* Four 8 x 8 b16 matrices from shared memory (each lane gives one row address). */
__device__ __forceinline__ void cu_ldsm4(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}

/* The same, each matrix transposed. */
__device__ __forceinline__ void cu_ldsm4_t(uint32_t r[4], const uint16_t *p)
{
    asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0, %1, %2, %3}, [%4];\n"
                 : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
                 : "r"(cu_smem_addr(p)));
}

/* d += a b: m16n8k16, A row-major 16 x 16, B "col" (K-major) 16 x 8, f16 (F16) or bf16 inputs, fp32 accumulators. */
template <bool F16>
__device__ __forceinline__ void cu_mma16816(float d[4], const uint32_t a[4], uint32_t b0, uint32_t b1)
{
    if constexpr (F16)
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.f16.f16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
    else
        asm volatile("mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0, %1, %2, %3}, {%4, %5, %6, %7}, "
                     "{%8, %9}, {%0, %1, %2, %3};\n"
                     : "+f"(d[0]), "+f"(d[1]), "+f"(d[2]), "+f"(d[3])
                     : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}

/* Two floats rounded (to nearest even) to the mma's input type, x in the low half. */
template <bool F16>
__device__ __forceinline__ uint32_t cu_pack2(float x, float y)
{
    if constexpr (F16) {
        const __half2 h = __floats2half2_rn(x, y);
        return *(const uint32_t *)&h;
    } else {
        const __nv_bfloat162 h = __floats2bfloat162_rn(x, y);
        return *(const uint32_t *)&h;
    }
}

/* The sum of the two rounded values packed in u, in fp32 (exact: both are bf16/f16 values). */
template <bool F16>
__device__ __forceinline__ float cu_unpack2_sum(uint32_t u)
{
    if constexpr (F16) {
        const float2 f = __half22float2(*(const __half2 *)&u);
        return f.x + f.y;
    } else {
        return __uint_as_float(u << 16) + __uint_as_float(u & 0xffff0000u);
    }
}

/* 16 bytes global -> shared through L2 only; bytes == 0 zero-fills the destination and reads nothing. */
__device__ __forceinline__ void cu_cp16(uint16_t *dst, const char *src, int bytes)
{
    asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(cu_smem_addr(dst)), "l"(src), "r"(bytes));
}

__device__ __forceinline__ void cu_cp_commit()
{
    asm volatile("cp.async.commit_group;\n" ::);
}

/* Wait until at most N of this thread's cp.async groups are still in flight. */
template <int N>
__device__ __forceinline__ void cu_cp_wait()
{
    asm volatile("cp.async.wait_group %0;\n" ::"n"(N) : "memory");
}

/* The attention kernels' reading of untrusted metadata (device data, never read back; berth/backend.h): in the
 * decode kernels a sequence whose query rows [q0, q1) from seq_q_start are empty or not inside [0, T] is skipped
 * (the same answer in every block of the sequence); in all of them its key count is clamped to [0, the block
 * table's row]. A: a kernel argument struct with T, bt_width and block_size. */
template <typename A>
__device__ __forceinline__ bool cu_attn_rows_ok(const A &a, int32_t q0, int32_t q1)
{
    return q0 >= 0 && q1 > q0 && q1 <= a.T;
}

template <typename A>
__device__ __forceinline__ int32_t cu_attn_kv_len(const A &a, int32_t raw)
{
    const int64_t cap = (int64_t)a.bt_width * a.block_size;
    const int64_t n = raw < 0 ? 0 : raw;
    return (int32_t)(n < cap ? n : cap);
}

/* Keys [lo, hi) that a query at pos sees among kv_len keys under the attention op's mask (BERTH_MASK_*) and
 * sliding window (0: none); hi == lo: none. */
__device__ __forceinline__ void cu_attn_row_range(int32_t mask, int32_t window, int32_t pos, int32_t kv_len,
                                                  int32_t *lo, int32_t *hi)
{
    if (mask == BERTH_MASK_NONE) {
        *lo = 0;
        *hi = kv_len;
        return;
    }
    int64_t h = (int64_t)pos + 1 < kv_len ? (int64_t)pos + 1 : kv_len;
    int64_t l = window > 0 ? (int64_t)pos - window + 1 : 0;
    l = l > 0 ? l : 0;
    h = h > l ? h : l;
    *lo = (int32_t)l;
    *hi = (int32_t)h;
}

/* The tile of block slot `slot` (0 = the first block): tiles are taken from the last one backwards, so the causal
 * tiles with the most keys start first and short ones fill the tail. tile_start[i] = first tile of sequence i,
 * tile_start[n_seqs] = the total. *seq: the sequence (largest i with tile_start[i] <= tile; -1 when the slot is
 * past the total), *tile: the tile's global index. */
__device__ __forceinline__ void cu_attn_tile_of(const int32_t *tile_start, int32_t n_seqs, int32_t slot, int32_t *seq,
                                                int32_t *tile)
{
    const int32_t total = tile_start[n_seqs];
    const int32_t b = total - 1 - slot;
    int32_t s = -1;
    if (slot < total) {
        int32_t lo = 0, hi = n_seqs - 1;
        while (lo < hi) {
            const int32_t mid = (lo + hi + 1) >> 1;
            if (tile_start[mid] <= b)
                lo = mid;
            else
                hi = mid - 1;
        }
        s = lo;
    }
    *seq = s;
    *tile = b;
}

#endif
