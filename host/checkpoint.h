/*
 * checkpoint.h — a Hugging Face checkpoint directory opened by the host: config.json (jansson) and the
 * safetensors files (mmap'd read-only, headers validated), single-file or sharded through
 * model.safetensors.index.json.
 *
 * The host owns all file parsing; plugins read the checkpoint through the BERTH_SVC_CHECKPOINT and
 * BERTH_SVC_TENSOR_LOAD services, whose implementations are the ckpt_svc_* functions below (same signatures as
 * the berth_host members). Every failure leaves a one-line message (errors.h) naming the file and tensor/field.
 */
#ifndef BERTH_HOST_CHECKPOINT_H
#define BERTH_HOST_CHECKPOINT_H

#include <berth/backend.h>
#include <berth/plugin.h>

/* Open dir: parse config.json, map and validate every safetensors file. Caller closes with ckpt_close.
 * With model.safetensors.index.json present its weight_map decides the shards (plain file names only: no '/',
 * no ".."), and every tensor it lists must be in its shard and vice versa; otherwise dir/model.safetensors.
 * A tensor name that occurs twice (in one file or across shards) is an error. Tensors of dtypes berth has no
 * berth_dtype for (BOOL, F64, F8_*, ...) are accepted here and refused when a plugin asks for them. */
berth_status ckpt_open(const char *dir, berth_checkpoint **out);
/* Free buffers made by tensor_load (through the backend that made them), unmap, free. Accepts NULL.
 * ORDER: close the checkpoint BEFORE destroying any backend it loaded tensors into (buffer_free is called on
 * that backend here). */
void ckpt_close(berth_checkpoint *ck);
/* BERTH_OK if the tensor data fits into `available` bytes, else BERTH_E_NOMEM with
 * "model DIR: weights need 9.26 GB but WHAT has 4.00 GB available" (GB = 1e9 bytes). The caller decides what
 * "available" means for its backend. */
berth_status ckpt_check_fits(const berth_checkpoint *ck, uint64_t available, const char *what);
/* config.json's top-level "model_type", or NULL if absent/not a string. */
const char *ckpt_model_type(const berth_checkpoint *ck);
/* Bytes of tensor data over all shards (for "does it fit" checks and progress). */
uint64_t ckpt_total_bytes(const berth_checkpoint *ck);
/* Ask the kernel to page in the mapped files, reporting progress (0..1) through cb when it is non-NULL. */
void ckpt_prefetch(const berth_checkpoint *ck, void (*cb)(double frac, void *arg), void *arg);

/* Service implementations (see berth_host in <berth/plugin.h> for the contracts).
 * JSON messages are labelled "config.json: <path>: ..." (the plugin or host adds the directory if it wants it).
 * tensor_at/tensor_find on a tensor whose dtype berth does not support fill *out completely (dtype -1) and
 * return BERTH_E_UNSUPPORTED naming it, so a plugin enumerating names can skip it; tensor_load refuses it.
 * tensor_load: with BERTH_CAP_WRAP_HOST the whole mapped shard is wrapped once per (checkpoint, backend) and the
 * result is a view at the tensor's offset — zero copy; its data may be unaligned for the dtype (the format does
 * not align it). Otherwise one WEIGHTS buffer per tensor is allocated and uploaded (stream made once per
 * backend, synced per tensor). Rank > 4 is BERTH_E_UNSUPPORTED. Safe to call from several threads. */
int32_t ckpt_svc_cfg_type(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path);
berth_status ckpt_svc_cfg_int(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out);
berth_status ckpt_svc_cfg_real(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, double *out);
berth_status ckpt_svc_cfg_bool(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int32_t *out);
berth_status ckpt_svc_cfg_string(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path,
                                 const char **out);
berth_status ckpt_svc_cfg_len(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t *out);
berth_status ckpt_svc_cfg_key(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *path, int64_t idx,
                              const char **out);
const char *ckpt_svc_dir(berth_host_ctx *ctx, const berth_checkpoint *ck);
int64_t ckpt_svc_tensor_count(berth_host_ctx *ctx, const berth_checkpoint *ck);
berth_status ckpt_svc_tensor_at(berth_host_ctx *ctx, const berth_checkpoint *ck, int64_t idx,
                                berth_tensor_info *out);
berth_status ckpt_svc_tensor_find(berth_host_ctx *ctx, const berth_checkpoint *ck, const char *name,
                                  berth_tensor_info *out);
berth_status ckpt_svc_tensor_load(berth_host_ctx *ctx, const berth_checkpoint *ck, const berth_backend_api *be,
                                  const char *name, berth_tensor *out);

#endif
