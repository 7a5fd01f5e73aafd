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

/* Open dir: parse config.json, map and validate every safetensors file. Caller closes with ckpt_close. */
berth_status ckpt_open(const char *dir, berth_checkpoint **out);
/* Free buffers made by tensor_load (through the backend that made them), unmap, free. Accepts NULL. */
void ckpt_close(berth_checkpoint *ck);
/* config.json's top-level "model_type", or NULL if absent/not a string. */
const char *ckpt_model_type(const berth_checkpoint *ck);
/* Bytes of tensor data over all shards (for "does it fit" checks and progress). */
uint64_t ckpt_total_bytes(const berth_checkpoint *ck);
/* Ask the kernel to page in the mapped files, reporting progress (0..1) through cb when it is non-NULL. */
void ckpt_prefetch(const berth_checkpoint *ck, void (*cb)(double frac, void *arg), void *arg);

/* Service implementations (see berth_host in <berth/plugin.h> for the contracts). */
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
