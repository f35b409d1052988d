/* Hugging Face tokenizers: a `tokenizer.json` loaded, text encoded to token ids and ids decoded
 * back to text, as the `tokenizers` library does for the two families Llama models ship
 * (docs/tokenize.md):
 *
 *   - byte-level BPE (GPT-2, Llama 3): a regex pre-tokenizer (PCRE2, with Oniguruma's meaning
 *     of the classes the patterns use), the ByteLevel byte-to-character map, BPE merges;
 *   - SentencePiece-style BPE (Llama 2, TinyLlama, Mistral): the `▁` metaspace (Prepend and
 *     Replace normalizers, or the Metaspace pre-tokenizer), BPE merges, byte fallback to
 *     <0x00>..<0xFF>, a fused <unk>.
 *
 * Added and special tokens written in the text are recognised (leftmost, longest first, with
 * their lstrip / rstrip / single_word flags), the post-processor's template adds BOS/EOS, and
 * the decoder chain turns ids back into text. A component the file names that is not
 * implemented is refused at load with TSR_EINVAL naming the file and the JSON key, never skipped.
 *
 * A loaded tokenizer is read-only and may be shared by threads; encoding needs a
 * tsr_tok_encoder_t per thread (its scratch buffers and word cache).
 */
#ifndef TESSERA_TOKENIZER_H
#define TESSERA_TOKENIZER_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "tessera/export.h"
#include "tessera/status.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct tsr_tokenizer_t tsr_tokenizer_t;
typedef struct tsr_tok_encoder_t tsr_tok_encoder_t;

/* Loads and checks `path` (a tokenizer.json). TSR_EIO when it cannot be read; TSR_EINVAL when it
 * is not valid JSON, lacks a key, names a component this build does not implement, or has merges
 * or added tokens that do not fit the vocabulary: the message names the file and the key
 * (`pre_tokenizer.pretokenizers[1].type`). */
TSR_API tsr_status tsr_tokenizer_load(const char *path, tsr_tokenizer_t **out);
/* NULL is a no-op. */
TSR_API void tsr_tokenizer_free(tsr_tokenizer_t *tok);

/* The path given to load. */
TSR_API const char *tsr_tokenizer_path(const tsr_tokenizer_t *tok);
/* One more than the largest id of the vocabulary and the added tokens: the embedding rows a
 * model needs. */
TSR_API int32_t tsr_tokenizer_vocab_size(const tsr_tokenizer_t *tok);
/* The id of token `token` (model vocabulary or added token), or -1. */
TSR_API int32_t tsr_tokenizer_token_to_id(const tsr_tokenizer_t *tok, const char *token);
/* The token string of `id` (NUL-terminated), or NULL when no token has that id. */
TSR_API const char *tsr_tokenizer_id_to_token(const tsr_tokenizer_t *tok, int32_t id);
/* True when `id` is an added token marked special. */
TSR_API bool tsr_tokenizer_is_special(const tsr_tokenizer_t *tok, int32_t id);
/* The ids the post-processor puts before (`head`) and after (`tail`) a single sequence when
 * special tokens are added (Llama: head = BOS). Either count may be 0; the arrays belong to the
 * tokenizer. */
TSR_API void tsr_tokenizer_template(const tsr_tokenizer_t *tok, const int32_t **head, int *nhead,
                                    const int32_t **tail, int *ntail);
/* The end-of-document token: the `eos_token` of a tokenizer_config.json beside the file when
 * there is one, else the first special token named </s>, <|end_of_text|>, <|endoftext|> or
 * <eos>; -1 when neither says. `*source` (may be NULL) gets where it came from, for messages. */
TSR_API int32_t tsr_tokenizer_eos(const tsr_tokenizer_t *tok, const char **source);

/* Flags of tsr_tok_encode and tsr_tokenizer_decode. */
#define TSR_TOK_ADD_SPECIAL   1u /* encode: add the post-processor's tokens (BOS) */
#define TSR_TOK_SPLIT_SPECIAL 2u /* encode: special tokens written in the text are plain text */
#define TSR_TOK_SKIP_SPECIAL  4u /* decode: leave out special tokens */

/* Scratch space and a word cache for encoding on one thread. */
TSR_API tsr_status tsr_tok_encoder_new(const tsr_tokenizer_t *tok, tsr_tok_encoder_t **out);
TSR_API void tsr_tok_encoder_free(tsr_tok_encoder_t *enc);

/* Encodes `len` bytes of UTF-8 `text` (NUL bytes allowed). *ids points into the encoder and
 * stays valid until its next call. TSR_EINVAL when the text is not valid UTF-8, naming the byte
 * offset. */
TSR_API tsr_status tsr_tok_encode(tsr_tok_encoder_t *enc, const char *text, size_t len,
                                  unsigned flags, const int32_t **ids, size_t *n);

/* The pieces the model would encode, for looking at what the normalizers and pre-tokenizers
 * do: each piece as text (bytes, before ByteLevel's character map), added tokens as their
 * content, the post-processor's tokens left out. Piece i is buf[ends[i-1] .. ends[i]) (from 0
 * for i = 0); both arrays point into the encoder, valid until its next call. */
TSR_API tsr_status tsr_tok_pieces(tsr_tok_encoder_t *enc, const char *text, size_t len,
                                  unsigned flags, const char **buf, const size_t **ends, size_t *n);

/* Decodes `n` ids through the tokenizer's decoder into a new NUL-terminated string (*text,
 * malloc'd; its length in *len, which may be NULL). TSR_EINVAL naming the position of an id
 * that no token has. */
TSR_API tsr_status tsr_tokenizer_decode(const tsr_tokenizer_t *tok, const int32_t *ids, size_t n,
                                        unsigned flags, char **text, size_t *len);

/* The length of the longest prefix of `s` that is valid UTF-8 (n when all of it is). */
TSR_API size_t tsr_utf8_valid_prefix(const char *s, size_t n);

#ifdef __cplusplus
}
#endif
#endif
