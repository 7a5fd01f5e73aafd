/*
 * tokenizer.h — Hugging Face tokenizer.json tokenizers: load, encode, decode, streaming detokenization.
 *
 * tok_load reads tokenizer.json (plain or gzip) and, optionally, tokenizer_config.json (BOS/EOS names). The
 * pipeline follows the Hugging Face `tokenizers` library: added tokens are split off first, the rest is
 * normalized, pre-tokenized and run through the model (BPE or Unigram); the post-processor adds BOS/EOS when
 * add_special is set. Decoding runs the decoder chain. Files are untrusted: every malformed field fails with a
 * one-line message (errors.h) naming the file and JSON field; nothing crashes.
 * A tokenizer is immutable after loading except for its internal word cache, so one tokenizer must be used by
 * one thread at a time.
 */
#ifndef BERTH_HOST_TOKENIZER_H
#define BERTH_HOST_TOKENIZER_H

#include <berth/plugin.h>
#include <stddef.h>
#include <stdint.h>

typedef struct berth_tokenizer berth_tokenizer;
typedef struct berth_tok_stream berth_tok_stream;

/* Load tokenizer_json_path (".gz" or plain); config_path may be NULL. *out is freed with tok_free. */
berth_status tok_load(const char *tokenizer_json_path, const char *tokenizer_config_path_or_NULL,
                      berth_tokenizer **out);
void tok_free(berth_tokenizer *t);

/* Encode len bytes of UTF-8 text. add_special runs the post-processor (BOS/EOS). *ids: caller frees (free()). */
berth_status tok_encode(berth_tokenizer *t, const char *text, size_t len, int add_special, int32_t **ids,
                        size_t *n);
/* Decode ids to NUL-terminated UTF-8. skip_special drops special added tokens. *text: caller frees. */
berth_status tok_decode(const berth_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text);
/* The same with the length in bytes: decoded text may hold NUL bytes (a "\0" token). */
berth_status tok_decode_n(const berth_tokenizer *t, const int32_t *ids, size_t n, int skip_special, char **text,
                          size_t *len);

/* The token string for id (as stored in the vocabulary, e.g. "Ġworld"), or NULL when id is out of range. */
const char *tok_id_to_piece(const berth_tokenizer *t, int32_t id);
/* The id of an exact token string, or -1. */
int32_t tok_piece_to_id(const berth_tokenizer *t, const char *piece);
/* Number of ids (highest id + 1, added tokens included). */
size_t tok_vocab_size(const berth_tokenizer *t);
/* BOS / EOS ids from tokenizer_config.json (falling back to the post-processor's first token for BOS), -1 if
 * none. tok_add_bos: whether encoding with add_special puts BOS first. */
int32_t tok_bos_id(const berth_tokenizer *t);
int32_t tok_eos_id(const berth_tokenizer *t);
int tok_is_special(const berth_tokenizer *t, int32_t id);

/* Streaming detokenizer: push ids one at a time; each push yields the text that became final (complete UTF-8,
 * possibly ""). The concatenation of every piece and the finish piece equals tok_decode of all pushed ids.
 * The stream borrows t, which must outlive it. Pieces: caller frees. */
berth_status tok_stream_new(const berth_tokenizer *t, int skip_special, berth_tok_stream **out);
berth_status tok_stream_push(berth_tok_stream *s, int32_t id, char **piece);
berth_status tok_stream_finish(berth_tok_stream *s, char **piece);
/* The same with the piece length in bytes (pieces may hold NUL bytes). */
berth_status tok_stream_push_n(berth_tok_stream *s, int32_t id, char **piece, size_t *len);
berth_status tok_stream_finish_n(berth_tok_stream *s, char **piece, size_t *len);
void tok_stream_free(berth_tok_stream *s);

#endif
