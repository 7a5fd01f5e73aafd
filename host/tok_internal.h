/*
 * tok_internal.h — shared structures of the tokenizer (tokenizer.c and tok_*.c); not a public interface.
 */
#ifndef BERTH_HOST_TOK_INTERNAL_H
#define BERTH_HOST_TOK_INTERNAL_H

#include "tokenizer.h"

#include <jansson.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#define TOK_PCRE2_CODE_UNIT_WIDTH 8

/* ---- growable byte string ---- */
typedef struct {
    char *p;
    size_t len, cap;
} tok_buf;
bool tok_buf_put(tok_buf *b, const void *s, size_t n); /* false on OOM; keeps p NUL-terminated */
void tok_buf_free(tok_buf *b);

/* ---- list of owned strings (pre-token splits, decoder tokens) ---- */
typedef struct {
    char **s;
    size_t *len;
    size_t n, cap;
} tok_strs;
bool tok_strs_push(tok_strs *l, const char *s, size_t n); /* copies */
void tok_strs_free(tok_strs *l);

/* ---- string -> int32 hash map (keys copied) ---- */
typedef struct {
    char **keys;
    uint32_t *klen;
    int32_t *vals;
    size_t cap, n;
} tok_strmap;
bool tok_strmap_put(tok_strmap *m, const char *k, size_t n, int32_t v); /* replaces */
int32_t tok_strmap_get(const tok_strmap *m, const char *k, size_t n);   /* -1 if absent */
void tok_strmap_free(tok_strmap *m);
uint64_t tok_hash(const void *p, size_t n);

/* ---- UTF-8 ---- */
size_t tok_utf8_len(const char *s, size_t n);                            /* bytes of the char at s (1 if invalid) */
int32_t tok_utf8_decode(const char *s, size_t n, size_t *adv);          /* -1 if invalid (adv = 1) */
size_t tok_utf8_encode(int32_t cp, char out[4]);
/* Rust String::from_utf8_lossy: each maximal invalid subpart becomes U+FFFD. */
bool tok_utf8_lossy(const char *s, size_t n, tok_buf *out);

/* ---- String / Regex patterns (tok_pattern.c): {"String": "..."} or {"Regex": "..."} (PCRE2, UTF + UCP) ---- */
typedef struct tok_pattern tok_pattern;
berth_status tok_pattern_parse(const json_t *j, const char *file, const char *field, tok_pattern **out);
/* Next non-empty match at or after from: true and [*ms, *me); false when none. */
bool tok_pattern_next(const tok_pattern *p, const char *s, size_t n, size_t from, size_t *ms, size_t *me);
void tok_pattern_free(tok_pattern *p);
berth_status tok_regex_compile(const char *re, const char *file, const char *field, tok_pattern **out);
bool tok_is_whitespace(int32_t cp); /* Unicode White_Space (Rust char::is_whitespace) */

/* ---- normalizers (tok_normalize.c) ---- */
typedef struct tok_normalizer tok_normalizer;
berth_status tok_normalizer_parse(const json_t *j, const char *file, const char *field, tok_normalizer **out);
berth_status tok_normalize(const tok_normalizer *n, const char *s, size_t len, tok_buf *out);
void tok_normalizer_free(tok_normalizer *n);
/* SentencePiece precompiled charsmap (tok_precompiled.c); j is the {"type": "Precompiled", ...} object. */
typedef struct tok_precompiled tok_precompiled;
berth_status tok_precompiled_parse(const json_t *j, const char *file, const char *field, tok_precompiled **out);
berth_status tok_precompiled_apply(const tok_precompiled *p, const char *s, size_t len, tok_buf *out);
void tok_precompiled_free(tok_precompiled *p);

/* ---- pre-tokenizers (tok_pretokenize.c) ---- */
typedef struct tok_pretok tok_pretok;
berth_status tok_pretok_parse(const json_t *j, const char *file, const char *field, tok_pretok **out);
/* Splits s into pieces appended to out. first: s starts the whole input (Metaspace prepend_scheme "first"). */
berth_status tok_pretokenize(const tok_pretok *p, const char *s, size_t len, bool first, tok_strs *out);
void tok_pretok_free(tok_pretok *p);
/* GPT-2 byte <-> unicode alphabet (ByteLevel). */
const char *tok_bytelevel_char(uint8_t b, size_t *n); /* UTF-8 of the char standing for byte b */
int tok_bytelevel_byte(int32_t cp);                    /* byte for a code point, -1 if not in the alphabet */

/* ---- models (tok_bpe.c, tok_unigram.c) ---- */
typedef struct tok_model tok_model;
struct berth_tokenizer;
berth_status tok_bpe_parse(struct berth_tokenizer *t, const json_t *model, const char *file, tok_model **out);
berth_status tok_unigram_parse(struct berth_tokenizer *t, const json_t *model, const char *file, tok_model **out);
struct tok_model {
    berth_status (*encode)(tok_model *m, const struct berth_tokenizer *t, const char *s, size_t n,
                           int32_t **ids, size_t *nids, size_t *cap);
    void (*free)(tok_model *m);
};
bool tok_ids_push(int32_t **ids, size_t *n, size_t *cap, int32_t id);

/* ---- decoders (tok_decode.c) ---- */
typedef struct tok_decoder tok_decoder;
berth_status tok_decoder_parse(const json_t *j, const char *file, const char *field, tok_decoder **out);
/* Runs the chain over tokens (consumed and replaced) and joins the result into out. */
berth_status tok_decoder_run(const tok_decoder *d, tok_strs *tokens, tok_buf *out);
void tok_decoder_free(tok_decoder *d);

/* ---- the tokenizer ---- */
typedef struct {
    char *content;      /* as written in the file */
    size_t len;
    char *norm;         /* content after the normalizer (normalized tokens only) */
    size_t norm_len;
    int32_t id;
    bool special, lstrip, rstrip, single_word, normalized;
} tok_added;

typedef struct {
    bool is_seq;     /* Sequence placeholder ($A) vs special token ids */
    int32_t *ids;
    size_t n;
} tok_tmpl_item;

struct berth_tokenizer {
    char *file;                 /* for messages */
    tok_strmap vocab;           /* piece -> id (model vocab and added tokens) */
    char **pieces;              /* id -> piece (NULL for holes) */
    uint32_t *piece_len;
    size_t n_ids;
    uint8_t *is_special;        /* per id */
    tok_added *added;
    size_t n_added;
    size_t *added_lens;         /* distinct byte lengths of raw added tokens, longest first */
    size_t n_added_lens;
    tok_strmap added_raw;       /* content -> index into added (normalized == false) */
    tok_strmap added_norm;      /* normalized content -> index (normalized == true) */
    size_t *added_norm_lens;
    size_t n_added_norm_lens;
    uint8_t added_first[32];      /* bitset of the first bytes of added_raw keys: split_added skips other bytes */
    uint8_t added_norm_first[32]; /* the same for added_norm */
    tok_normalizer *normalizer;
    tok_pretok *pretok;
    tok_model *model;
    tok_decoder *decoder;
    tok_tmpl_item *tmpl;        /* post-processor template for a single sequence; NULL = none */
    size_t n_tmpl;
    int32_t bos_id, eos_id;
};

#endif
