//! Byte-level BPE tokenizer (GPT-2 style) from a GGUF file's `tokenizer.ggml.*` metadata,
//! run by Hugging Face's `tokenizers`: the file's vocabulary and merges become a
//! `tokenizers` BPE model with the pre-tokenizer llama.cpp names in `tokenizer.ggml.pre`, the
//! byte-level decoder and the file's special tokens. This module reads and checks the
//! metadata; the splitting, merging and decoding are `tokenizers`' own.
//!
//! # Format
//!
//! A GGUF file with `tokenizer.ggml.model = "gpt2"` carries:
//!
//! - `tokenizer.ggml.tokens`: the vocabulary, token id = index. Ordinary tokens are written
//!   in GPT-2's byte-to-unicode alphabet: every byte maps to one printable character
//!   (printable Latin-1 bytes to themselves, the other 68 to U+0100..U+0143, so a space is
//!   `Ġ` and a newline `Ċ`); a token's text is the concatenation of its bytes' characters.
//! - `tokenizer.ggml.token_type` (optional): llama.cpp's token types; 3 (control, such as
//!   `<|im_start|>`) and 4 (user-defined) are special tokens, matched literally in the input
//!   (leftmost, longest first) and decoded as their literal text.
//! - `tokenizer.ggml.merges`: `"left right"` pairs, highest priority first; merging the
//!   pair yields the token `left + right`.
//! - `tokenizer.ggml.pre`: the pre-tokenizer, which splits text into pieces that BPE
//!   encodes independently (see [`PreTokenizer`]).
//! - `tokenizer.ggml.bos_token_id`, `eos_token_id`, `add_bos_token` (all optional).
//!
//! # What is checked
//!
//! Everything is checked when the tokenizer is built: every merge must name two tokens
//! whose concatenation is also a token, the token-type array must match the vocabulary,
//! ids must fit in u32, and the BOS/EOS ids must lie in the vocabulary. A byte whose symbol
//! is not in the vocabulary is dropped when encoding, as llama.cpp and `tokenizers` (without
//! an unknown token) do; SmolLM2's vocabulary lacks 21 such bytes (see
//! [`ByteLevelBpe::unencodable_bytes`]): six rare control characters, the UTF-8 lead bytes
//! 0xF1 and 0xF2 (code points U+40000..U+BFFFF) and bytes that never occur in UTF-8. Text
//! containing them does not round-trip.

use std::collections::HashMap;
use std::fmt;

use tokenizers::models::bpe::{Vocab, BPE};
use tokenizers::pre_tokenizers::byte_level::ByteLevel;
use tokenizers::pre_tokenizers::digits::Digits;
use tokenizers::pre_tokenizers::sequence::Sequence;
use tokenizers::pre_tokenizers::PreTokenizerWrapper;
use tokenizers::{AddedToken, Tokenizer};

use crate::gguf::{GgufError, GgufFile};

/// llama.cpp token type of ordinary tokens.
pub const TOKEN_TYPE_NORMAL: i32 = 1;
/// llama.cpp token type of control tokens (`<|im_start|>`, `<|endoftext|>`, ...).
pub const TOKEN_TYPE_CONTROL: i32 = 3;
/// llama.cpp token type of user-defined tokens, also matched literally.
pub const TOKEN_TYPE_USER_DEFINED: i32 = 4;

/// The system message of SmolLM2-Instruct's chat template.
pub const SMOLLM2_SYSTEM_PROMPT: &str =
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face";

/// The prompt SmolLM2-Instruct's chat template (`tokenizer.chat_template`) renders for one
/// user message with its default system message and `add_generation_prompt = true`:
///
/// ```text
/// <|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n
/// ```
///
/// `user` is inserted verbatim; like Hugging Face's `apply_chat_template` followed by
/// `encode`, special-token text inside it (`<|im_end|>`) is encoded as the special token.
/// No BOS token is involved (`add_bos_token` is false for this model).
pub fn chat_prompt(user: &str) -> String {
    format!(
        "<|im_start|>system\n{SMOLLM2_SYSTEM_PROMPT}<|im_end|>\n<|im_start|>user\n{user}<|im_end|>\n<|im_start|>assistant\n"
    )
}

/// Why a tokenizer could not be built, or a text not encoded.
#[derive(Debug, thiserror::Error)]
pub enum BpeError {
    /// Reading the GGUF metadata failed (missing key, wrong type).
    #[error(transparent)]
    Gguf(#[from] GgufError),
    /// `tokenizer.ggml.model` is not `"gpt2"`.
    #[error("unsupported tokenizer model {0:?}: this tokenizer reads byte-level BPE (\"gpt2\")")]
    UnsupportedModel(String),
    /// `tokenizer.ggml.pre` names a pre-tokenizer not set up here.
    #[error("unsupported pre-tokenizer {0:?} (supported: \"smollm\", \"gpt-2\")")]
    UnsupportedPre(String),
    /// The vocabulary has more entries than u32 ids can name.
    #[error("vocabulary of {0} tokens does not fit in u32 ids")]
    VocabTooLarge(usize),
    /// The token-type array does not have one entry per token.
    #[error("{types} token types for {tokens} tokens")]
    TokenTypeCount {
        /// Vocabulary size.
        tokens: usize,
        /// Token-type entries.
        types: usize,
    },
    /// A merge that is not two non-empty tokens separated by a space.
    #[error("merge #{index} {merge:?} is not two tokens separated by a space")]
    BadMerge {
        /// Index in the merge list (its rank).
        index: usize,
        /// The merge as written.
        merge: String,
    },
    /// A merge naming (or producing) a token that is not in the vocabulary.
    #[error("merge #{index} {merge:?}: token {token:?} is not in the vocabulary")]
    MergeTokenUnknown {
        /// Index in the merge list (its rank).
        index: usize,
        /// The merge as written.
        merge: String,
        /// The missing token.
        token: String,
    },
    /// A BOS/EOS id outside the vocabulary.
    #[error("{what} token id {id} is out of range for a vocabulary of {vocab_size} tokens")]
    IdOutOfRange {
        /// `"BOS"` or `"EOS"`.
        what: &'static str,
        /// The id.
        id: u32,
        /// Vocabulary size.
        vocab_size: usize,
    },
    /// `tokenizers` refused the model, or failed on a text.
    #[error("tokenizer: {0}")]
    Tokenizer(String),
}

/// How text is split into pieces before BPE, by `tokenizer.ggml.pre`.
///
/// Both use the GPT-2 pattern
/// `'s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+`
/// (`tokenizers`' `ByteLevel` pre-tokenizer without a prefix space).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum PreTokenizer {
    /// `"smollm"`: first every digit becomes a piece of its own (so numbers are encoded
    /// digit by digit), then the GPT-2 pattern splits the text in between. This is
    /// llama.cpp's `LLAMA_VOCAB_PRE_TYPE_SMOLLM` and Hugging Face's
    /// `Sequence[Digits(individual_digits=True), ByteLevel(use_regex=True)]`.
    SmolLm,
    /// `"gpt-2"`: the GPT-2 pattern alone (digits grouped by ` ?\p{N}+`).
    Gpt2,
}

impl PreTokenizer {
    /// The pre-tokenizer for a `tokenizer.ggml.pre` value.
    pub fn from_name(name: &str) -> Result<Self, BpeError> {
        match name {
            "smollm" => Ok(PreTokenizer::SmolLm),
            "gpt-2" => Ok(PreTokenizer::Gpt2),
            other => Err(BpeError::UnsupportedPre(other.to_string())),
        }
    }

    /// The `tokenizers` pre-tokenizer.
    fn wrapper(self) -> PreTokenizerWrapper {
        let byte_level = ByteLevel::new(false, true, true);
        match self {
            PreTokenizer::Gpt2 => byte_level.into(),
            PreTokenizer::SmolLm => {
                Sequence::new(vec![Digits::new(true).into(), byte_level.into()]).into()
            }
        }
    }
}

/// GPT-2's byte-to-unicode table: printable Latin-1 bytes map to themselves, the other 68
/// bytes, in order, to U+0100 + k (what a byte-level vocabulary is written in).
pub fn byte_to_char_table() -> [char; 256] {
    let mut table = ['\0'; 256];
    let mut next_extra = 0u32;
    for (b, slot) in table.iter_mut().enumerate() {
        let printable = matches!(b, 0x21..=0x7E | 0xA1..=0xAC | 0xAE..=0xFF);
        let cp = if printable {
            b as u32
        } else {
            next_extra += 1;
            0xFF + next_extra
        };
        *slot = char::from_u32(cp).unwrap_or('\u{FFFD}');
    }
    table
}

/// A byte-level BPE tokenizer; `encode` and `decode` take `&self`, so one tokenizer can be
/// shared between threads.
pub struct ByteLevelBpe {
    tokenizer: Tokenizer,
    tokens: Vec<String>,
    token_types: Vec<i32>,
    token_to_id: HashMap<String, u32>,
    pre: PreTokenizer,
    bos: Option<u32>,
    eos: Option<u32>,
    add_bos: bool,
}

impl fmt::Debug for ByteLevelBpe {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.debug_struct("ByteLevelBpe")
            .field("vocab_size", &self.tokens.len())
            .field(
                "special_tokens",
                &(0..self.tokens.len() as u32)
                    .filter(|&id| self.is_special(id))
                    .count(),
            )
            .field("pre", &self.pre)
            .field("bos", &self.bos)
            .field("eos", &self.eos)
            .finish()
    }
}

fn is_special_type(ty: i32) -> bool {
    ty == TOKEN_TYPE_CONTROL || ty == TOKEN_TYPE_USER_DEFINED
}

impl ByteLevelBpe {
    /// Builds the tokenizer from a GGUF file's `tokenizer.ggml.*` metadata (see the module
    /// docs for the keys). `token_type`, the BOS/EOS ids and `add_bos_token` are optional.
    pub fn from_gguf(file: &GgufFile) -> Result<Self, BpeError> {
        let model = file.get_str("tokenizer.ggml.model")?;
        if model != "gpt2" {
            return Err(BpeError::UnsupportedModel(model.to_string()));
        }
        let pre = PreTokenizer::from_name(file.get_str("tokenizer.ggml.pre")?)?;
        let tokens = file.get_str_array("tokenizer.ggml.tokens")?.to_vec();
        let token_types = match file.metadata("tokenizer.ggml.token_type") {
            None => vec![TOKEN_TYPE_NORMAL; tokens.len()],
            Some(_) => file.get_i32_array("tokenizer.ggml.token_type")?.to_vec(),
        };
        let merges = file.get_str_array("tokenizer.ggml.merges")?;
        let optional_id = |key: &str| match file.metadata(key) {
            None => Ok(None),
            Some(_) => file.get_u32(key).map(Some),
        };
        let bos = optional_id("tokenizer.ggml.bos_token_id")?;
        let eos = optional_id("tokenizer.ggml.eos_token_id")?;
        let mut bpe = Self::new(tokens, token_types, merges, pre, bos, eos)?;
        if file.metadata("tokenizer.ggml.add_bos_token").is_some() {
            bpe.add_bos = file.get_bool("tokenizer.ggml.add_bos_token")?;
        }
        Ok(bpe)
    }

    /// Builds the tokenizer from plain parts: the vocabulary (byte-level strings, id =
    /// index), one llama.cpp token type per token, the merges (`"left right"`, highest
    /// priority first) and the BOS/EOS ids. Duplicate token strings map to the last id.
    /// `add_bos_token` starts false.
    pub fn new(
        tokens: Vec<String>,
        token_types: Vec<i32>,
        merges: &[impl AsRef<str>],
        pre: PreTokenizer,
        bos: Option<u32>,
        eos: Option<u32>,
    ) -> Result<Self, BpeError> {
        if u32::try_from(tokens.len()).is_err() {
            return Err(BpeError::VocabTooLarge(tokens.len()));
        }
        if token_types.len() != tokens.len() {
            return Err(BpeError::TokenTypeCount {
                tokens: tokens.len(),
                types: token_types.len(),
            });
        }
        for (what, id) in [("BOS", bos), ("EOS", eos)] {
            if let Some(id) = id.filter(|&id| id as usize >= tokens.len()) {
                return Err(BpeError::IdOutOfRange {
                    what,
                    id,
                    vocab_size: tokens.len(),
                });
            }
        }
        let token_to_id: HashMap<String, u32> = tokens
            .iter()
            .enumerate()
            .map(|(i, t)| (t.clone(), i as u32))
            .collect();

        let mut pairs = Vec::with_capacity(merges.len());
        for (index, merge) in merges.iter().enumerate() {
            let merge = merge.as_ref();
            let bad = || BpeError::BadMerge {
                index,
                merge: merge.to_string(),
            };
            // Split at the first space after the first character, as llama.cpp does.
            let first_len = merge.chars().next().map_or(0, char::len_utf8);
            let split = merge[first_len..]
                .find(' ')
                .map(|p| p + first_len)
                .ok_or_else(bad)?;
            let (left, right) = (&merge[..split], &merge[split + 1..]);
            if left.is_empty() || right.is_empty() {
                return Err(bad());
            }
            for token in [left, right, &format!("{left}{right}")] {
                if !token_to_id.contains_key(token) {
                    return Err(BpeError::MergeTokenUnknown {
                        index,
                        merge: merge.to_string(),
                        token: token.to_string(),
                    });
                }
            }
            pairs.push((left.to_string(), right.to_string()));
        }

        let vocab: Vocab = token_to_id.iter().map(|(t, &id)| (t.clone(), id)).collect();
        let model = BPE::builder()
            .vocab_and_merges(vocab, pairs)
            .build()
            .map_err(|e| BpeError::Tokenizer(e.to_string()))?;
        let mut tokenizer = Tokenizer::new(model);
        tokenizer.with_pre_tokenizer(Some(pre.wrapper()));
        tokenizer.with_decoder(Some(ByteLevel::default()));
        let specials: Vec<AddedToken> = tokens
            .iter()
            .zip(&token_types)
            .filter(|(t, &ty)| is_special_type(ty) && !t.is_empty())
            .map(|(t, _)| AddedToken::from(t.clone(), true).normalized(false))
            .collect();
        tokenizer.add_special_tokens(&specials);

        Ok(ByteLevelBpe {
            tokenizer,
            tokens,
            token_types,
            token_to_id,
            pre,
            bos,
            eos,
            add_bos: false,
        })
    }

    /// Number of tokens.
    pub fn vocab_size(&self) -> usize {
        self.tokens.len()
    }

    /// The beginning-of-sequence token, if the file names one.
    pub fn bos_id(&self) -> Option<u32> {
        self.bos
    }

    /// The end-of-sequence token, if the file names one (`<|im_end|>` = 2 for SmolLM2).
    pub fn eos_id(&self) -> Option<u32> {
        self.eos
    }

    /// `tokenizer.ggml.add_bos_token`: whether a prompt should start with BOS. [`encode`]
    /// never adds it; the caller decides.
    ///
    /// [`encode`]: ByteLevelBpe::encode
    pub fn add_bos_token(&self) -> bool {
        self.add_bos
    }

    /// Bytes whose byte-level symbol is not in the vocabulary; [`encode`] drops them.
    ///
    /// [`encode`]: ByteLevelBpe::encode
    pub fn unencodable_bytes(&self) -> Vec<u8> {
        let table = byte_to_char_table();
        (0..=255u8)
            .filter(|&b| {
                !self
                    .token_to_id
                    .contains_key(table[b as usize].encode_utf8(&mut [0; 4]) as &str)
            })
            .collect()
    }

    /// The pre-tokenizer in use.
    pub fn pre_tokenizer(&self) -> PreTokenizer {
        self.pre
    }

    /// The id of a token given as its vocabulary string (byte-level form for ordinary
    /// tokens: `"Ġthe"`; literal for special tokens: `"<|im_end|>"`).
    pub fn token_to_id(&self, token: &str) -> Option<u32> {
        self.token_to_id.get(token).copied()
    }

    /// A token's vocabulary string.
    pub fn id_to_token(&self, id: u32) -> Option<&str> {
        self.tokens.get(id as usize).map(String::as_str)
    }

    /// Whether `id` is a special token (control or user-defined), matched literally.
    pub fn is_special(&self, id: u32) -> bool {
        self.token_types
            .get(id as usize)
            .is_some_and(|&ty| is_special_type(ty))
    }

    /// Encodes `text`: special tokens matched literally, the rest pre-tokenized and
    /// merged. No BOS is added. Bytes listed by [`ByteLevelBpe::unencodable_bytes`] are
    /// dropped.
    pub fn encode(&self, text: &str) -> Result<Vec<u32>, BpeError> {
        self.tokenizer
            .encode(text, false)
            .map(|e| e.get_ids().to_vec())
            .map_err(|e| BpeError::Tokenizer(e.to_string()))
    }

    /// Decodes ids to text (special tokens as their literal text; ids outside the
    /// vocabulary are skipped). Byte sequences that are not UTF-8 become U+FFFD.
    pub fn decode(&self, ids: &[u32]) -> Result<String, BpeError> {
        self.tokenizer
            .decode(ids, false)
            .map_err(|e| BpeError::Tokenizer(e.to_string()))
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::gguf::tests::{smollm2, GgufWriter, Rng};
    use crate::gguf::{Array, Value};

    fn byte_vocab() -> Vec<String> {
        byte_to_char_table().iter().map(|c| c.to_string()).collect()
    }

    /// The 256 byte symbols, one token per merge result, then `extra` tokens.
    fn tiny(merges: &[&str], extra: &[(&str, i32)], pre: PreTokenizer) -> ByteLevelBpe {
        let (tokens, types) = tiny_vocab(merges, extra);
        ByteLevelBpe::new(tokens, types, merges, pre, None, None).unwrap()
    }

    fn tiny_vocab(merges: &[&str], extra: &[(&str, i32)]) -> (Vec<String>, Vec<i32>) {
        let mut tokens = byte_vocab();
        for m in merges {
            let merged = m.replacen(' ', "", 1);
            if !tokens.contains(&merged) {
                tokens.push(merged);
            }
        }
        tokens.extend(extra.iter().map(|(t, _)| t.to_string()));
        let mut types = vec![TOKEN_TYPE_NORMAL; tokens.len() - extra.len()];
        types.extend(extra.iter().map(|&(_, ty)| ty));
        (tokens, types)
    }

    fn strs<'a>(bpe: &'a ByteLevelBpe, ids: &[u32]) -> Vec<&'a str> {
        ids.iter().map(|&id| bpe.id_to_token(id).unwrap()).collect()
    }

    fn enc<'a>(bpe: &'a ByteLevelBpe, text: &str) -> Vec<&'a str> {
        strs(bpe, &bpe.encode(text).unwrap())
    }

    const HELLO_MERGES: &[&str] = &[
        "h e", "l l", "he ll", "hell o", "Ġ w", "o r", "Ġw or", "l d", "Ġwor ld", "Ġ Ġ",
    ];

    #[test]
    fn byte_to_unicode_table() {
        let t = byte_to_char_table();
        let distinct: std::collections::HashSet<char> = t.iter().copied().collect();
        assert_eq!(distinct.len(), 256);
        assert_eq!(
            (t[b'!' as usize], t[b'~' as usize], t[b'A' as usize]),
            ('!', '~', 'A')
        );
        assert_eq!(
            (t[b' ' as usize], t[b'\n' as usize], t[b'\t' as usize]),
            ('Ġ', 'Ċ', 'ĉ')
        );
        assert_eq!(
            (t[0], t[0x7F], t[0xA0], t[0xAD]),
            ('\u{100}', '\u{121}', '\u{142}', '\u{143}')
        );
        assert_eq!((t[0xA1], t[0xAC], t[0xAE], t[0xFF]), ('¡', '¬', '®', 'ÿ'));
    }

    #[test]
    fn the_pre_tokenizer_follows_tokenizer_ggml_pre() {
        // Digits only merge within a piece: SmolLM makes every digit a piece of its own,
        // GPT-2 keeps ` ?\p{N}+` together.
        let smollm = tiny(&["1 2", "Ġ 1"], &[], PreTokenizer::SmolLm);
        assert_eq!(
            enc(&smollm, "12 x12 a 7b"),
            ["1", "2", "Ġ", "x", "1", "2", "Ġ", "a", "Ġ", "7", "b"]
        );
        let gpt2 = tiny(&["1 2", "Ġ 1"], &[], PreTokenizer::Gpt2);
        assert_eq!(enc(&gpt2, "12 x12"), ["12", "Ġ", "x", "12"]);
        // The merge listed first wins: "1 2" before "Ġ 1".
        assert_eq!(enc(&gpt2, " 12"), ["Ġ", "12"]);
        assert_eq!(
            PreTokenizer::from_name("smollm").unwrap(),
            PreTokenizer::SmolLm
        );
        assert_eq!(
            PreTokenizer::from_name("gpt-2").unwrap(),
            PreTokenizer::Gpt2
        );
        let err = PreTokenizer::from_name("llama3").unwrap_err();
        assert!(matches!(&err, BpeError::UnsupportedPre(p) if p == "llama3"));
        assert_eq!(
            err.to_string(),
            "unsupported pre-tokenizer \"llama3\" (supported: \"smollm\", \"gpt-2\")"
        );
    }

    #[test]
    fn merges_apply_in_the_files_order() {
        let bpe = tiny(HELLO_MERGES, &[], PreTokenizer::SmolLm);
        assert_eq!(enc(&bpe, "hello world"), ["hello", "Ġworld"]);
        assert_eq!(enc(&bpe, "hello  world"), ["hello", "Ġ", "Ġworld"]);
        assert_eq!(enc(&bpe, "hex"), ["he", "x"]);
        // The merge listed first wins between overlapping pairs.
        let ab_first = tiny(&["a b", "b c"], &[], PreTokenizer::SmolLm);
        assert_eq!(enc(&ab_first, "abc"), ["ab", "c"]);
        let bc_first = tiny(&["b c", "a b"], &[], PreTokenizer::SmolLm);
        assert_eq!(enc(&bc_first, "abc"), ["a", "bc"]);
    }

    #[test]
    fn special_tokens_match_literally_longest_first() {
        let bpe = tiny(
            HELLO_MERGES,
            &[
                ("<|eot|>", TOKEN_TYPE_CONTROL),
                ("<|e", TOKEN_TYPE_USER_DEFINED),
                ("<x>", TOKEN_TYPE_NORMAL),
            ],
            PreTokenizer::SmolLm,
        );
        let eot = bpe.token_to_id("<|eot|>").unwrap();
        let e = bpe.token_to_id("<|e").unwrap();
        let ids = bpe.encode("hello<|eot|><|eot|> world<|e>").unwrap();
        assert_eq!(
            strs(&bpe, &ids),
            ["hello", "<|eot|>", "<|eot|>", "Ġworld", "<|e", ">"]
        );
        assert_eq!((ids[1], ids[4]), (eot, e));
        assert!(bpe.is_special(eot) && bpe.is_special(e));
        // A normal token is not matched literally: "<x>" goes through BPE as bytes.
        assert_eq!(enc(&bpe, "<x>"), ["<", "x", ">"]);
        assert!(!bpe.is_special(bpe.token_to_id("<x>").unwrap()));
        assert_eq!(bpe.decode(&ids).unwrap(), "hello<|eot|><|eot|> world<|e>");
        // Specials split the text for pre-tokenization: no piece spans one.
        assert_eq!(enc(&bpe, " <|eot|>he"), ["Ġ", "<|eot|>", "he"]);
    }

    #[test]
    fn decode_round_trips_and_is_lossy_on_bad_bytes() {
        let bpe = tiny(
            HELLO_MERGES,
            &[("<|eot|>", TOKEN_TYPE_CONTROL)],
            PreTokenizer::SmolLm,
        );
        let texts = [
            "hello world",
            "",
            "  leading, trailing  \n",
            "\u{0}\u{1}\u{7f}\u{ad} control bytes",
            "café naïve 日本語 🙂 ½²",
            "tabs\tand\r\nCRLF <|eot|> don't 12345",
        ];
        for t in texts {
            assert_eq!(bpe.decode(&bpe.encode(t).unwrap()).unwrap(), t);
        }
        let mut rng = Rng::new(99);
        for _ in 0..300 {
            let len = rng.below(20);
            let s: String = (0..len)
                .map(|_| match rng.below(4) {
                    0 => char::from(b' ' + rng.below(95) as u8),
                    1 => ['\n', '\t', ' ', '\'', '7'][rng.below(5)],
                    _ => char::from_u32(rng.below(0x2FFFF) as u32).unwrap_or('x'),
                })
                .collect();
            assert_eq!(bpe.decode(&bpe.encode(&s).unwrap()).unwrap(), s, "{s:?}");
        }
        let byte = |b: u8| {
            bpe.token_to_id(&byte_to_char_table()[b as usize].to_string())
                .unwrap()
        };
        assert_eq!(bpe.decode(&[byte(0xF0), byte(b'a')]).unwrap(), "\u{FFFD}a");
        assert_eq!(bpe.decode(&[byte(0xFF)]).unwrap(), "\u{FFFD}");
    }

    #[test]
    fn construction_errors() {
        let (tokens, types) = tiny_vocab(&["a b"], &[]);
        let build = |tokens: Vec<String>, types: Vec<i32>, merges: &[&str]| {
            ByteLevelBpe::new(
                tokens,
                types,
                merges,
                PreTokenizer::SmolLm,
                Some(0),
                Some(1),
            )
        };
        assert!(build(tokens.clone(), types.clone(), &["a b"]).is_ok());
        // A byte without a symbol token is dropped by encode (and listed).
        let mut missing = tokens.clone();
        missing[b'\n' as usize] = "not a byte".into();
        let bpe = build(missing, types.clone(), &["a b"]).unwrap();
        assert_eq!(bpe.unencodable_bytes(), [b'\n']);
        assert_eq!(enc(&bpe, "ab\n\nab\n"), ["ab", "ab"]);
        assert_eq!(
            build(tokens.clone(), types.clone(), &[])
                .unwrap()
                .unencodable_bytes(),
            Vec::<u8>::new()
        );
        for bad in ["ab", "a ", " a", ""] {
            let err = build(tokens.clone(), types.clone(), &["a b", bad]).unwrap_err();
            assert!(
                matches!(&err, BpeError::BadMerge { index: 1, merge } if merge == bad),
                "{bad:?}: {err:?}"
            );
        }
        let err = build(tokens.clone(), types.clone(), &["b a"]).unwrap_err();
        assert!(
            matches!(&err, BpeError::MergeTokenUnknown { token, .. } if token == "ba"),
            "{err:?}"
        );
        let err = build(tokens.clone(), types.clone(), &["a zz"]).unwrap_err();
        assert!(
            matches!(&err, BpeError::MergeTokenUnknown { token, .. } if token == "zz"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "merge #0 \"a zz\": token \"zz\" is not in the vocabulary"
        );
        let err = build(tokens.clone(), types[1..].to_vec(), &[]).unwrap_err();
        assert!(
            matches!(
                err,
                BpeError::TokenTypeCount {
                    tokens: 257,
                    types: 256
                }
            ),
            "{err:?}"
        );
        let err = ByteLevelBpe::new(
            tokens.clone(),
            types.clone(),
            &["a b"],
            PreTokenizer::SmolLm,
            None,
            Some(257),
        )
        .unwrap_err();
        assert!(
            matches!(
                err,
                BpeError::IdOutOfRange {
                    what: "EOS",
                    id: 257,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    fn tokenizer_gguf(model: &str, pre: &str, types: Option<Value>) -> crate::gguf::GgufFile {
        let (tokens, tys) = tiny_vocab(HELLO_MERGES, &[("<|im_end|>", TOKEN_TYPE_CONTROL)]);
        let mut w = GgufWriter::new()
            .kv("tokenizer.ggml.model", Value::String(model.into()))
            .kv("tokenizer.ggml.pre", Value::String(pre.into()))
            .kv("tokenizer.ggml.tokens", Value::Array(Array::String(tokens)))
            .kv(
                "tokenizer.ggml.merges",
                Value::Array(Array::String(
                    HELLO_MERGES.iter().map(|s| s.to_string()).collect(),
                )),
            )
            .kv(
                "tokenizer.ggml.bos_token_id",
                Value::U32(b'B' as u32 - 0x21),
            )
            .kv("tokenizer.ggml.eos_token_id", Value::U32(266))
            .kv("tokenizer.ggml.add_bos_token", Value::Bool(true));
        w = w.kv(
            "tokenizer.ggml.token_type",
            types.unwrap_or(Value::Array(Array::I32(tys))),
        );
        crate::gguf::GgufFile::parse(w.build()).unwrap()
    }

    #[test]
    fn from_gguf_metadata() {
        let bpe = ByteLevelBpe::from_gguf(&tokenizer_gguf("gpt2", "smollm", None)).unwrap();
        assert_eq!(bpe.vocab_size(), 256 + HELLO_MERGES.len() + 1);
        assert_eq!(
            (bpe.bos_id(), bpe.eos_id(), bpe.add_bos_token()),
            (Some(33), Some(266), true)
        );
        assert_eq!(bpe.id_to_token(266), Some("<|im_end|>"));
        assert_eq!(
            enc(&bpe, "hello world<|im_end|>"),
            ["hello", "Ġworld", "<|im_end|>"]
        );
        assert_eq!(bpe.pre_tokenizer(), PreTokenizer::SmolLm);
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf("llama", "smollm", None)).unwrap_err();
        assert!(
            matches!(&err, BpeError::UnsupportedModel(m) if m == "llama"),
            "{err:?}"
        );
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf("gpt2", "qwen2", None)).unwrap_err();
        assert!(
            matches!(&err, BpeError::UnsupportedPre(p) if p == "qwen2"),
            "{err:?}"
        );
        let err = ByteLevelBpe::from_gguf(&tokenizer_gguf(
            "gpt2",
            "smollm",
            Some(Value::Array(Array::U32(vec![]))),
        ))
        .unwrap_err();
        assert!(
            matches!(err, BpeError::Gguf(GgufError::WrongType { .. })),
            "{err:?}"
        );
        let empty = crate::gguf::GgufFile::parse(GgufWriter::new().build()).unwrap();
        let err = ByteLevelBpe::from_gguf(&empty).unwrap_err();
        assert!(
            matches!(&err, BpeError::Gguf(GgufError::MissingKey(k)) if k == "tokenizer.ggml.model"),
            "{err:?}"
        );
    }

    #[test]
    fn chat_prompt_is_the_smollm2_template() {
        assert_eq!(
            chat_prompt("Hi there"),
            "<|im_start|>system\nYou are a helpful AI assistant named SmolLM, trained by Hugging Face<|im_end|>\n\
             <|im_start|>user\nHi there<|im_end|>\n<|im_start|>assistant\n"
        );
    }

    #[test]
    fn real_smollm2_tokenizer() {
        let Some(file) = smollm2() else { return };
        let bpe = ByteLevelBpe::from_gguf(file).unwrap();
        assert_eq!(bpe.vocab_size(), 49152);
        assert_eq!(
            (bpe.bos_id(), bpe.eos_id(), bpe.add_bos_token()),
            (Some(1), Some(2), false)
        );
        assert_eq!(bpe.pre_tokenizer(), PreTokenizer::SmolLm);
        assert_eq!(bpe.token_to_id("<|im_start|>"), Some(1));
        assert_eq!(bpe.token_to_id("<|im_end|>"), Some(2));
        assert_eq!(bpe.token_to_id("<|endoftext|>"), Some(0));
        assert_eq!(bpe.token_to_id("Ġthe"), Some(260));
        assert!(bpe.is_special(2) && !bpe.is_special(260));
        let missing = [0x04, 0x06, 0x13, 0x14, 0x16, 0x1d, 0xc0, 0xc1, 0xf1, 0xf2];
        assert_eq!(
            bpe.unencodable_bytes(),
            [&missing[..], &(0xf5..=0xff).collect::<Vec<u8>>()].concat()
        );

        let fixture: serde_json::Value =
            serde_json::from_str(include_str!("testdata/bpe_reference.json")).unwrap();
        let user = fixture["chat_user"].as_str().unwrap();
        let cases = fixture["cases"].as_array().unwrap();
        assert!(cases.len() > 100);
        assert_eq!(cases.iter().filter(|c| c["lossy"] == true).count(), 2);
        assert!(cases
            .iter()
            .any(|c| c["text"].as_str() == Some(chat_prompt(user).as_str())));
        let mut failures = Vec::new();
        for case in cases {
            let text = case["text"].as_str().unwrap();
            let want: Vec<u32> = case["ids"]
                .as_array()
                .unwrap()
                .iter()
                .map(|v| v.as_u64().unwrap() as u32)
                .collect();
            let got = bpe.encode(text).unwrap();
            if got != want {
                failures.push(format!(
                    "{text:?}\n   got  {:?}\n   want {:?}",
                    strs(&bpe, &got),
                    strs(&bpe, &want)
                ));
            }
            let decoded = bpe.decode(&got).unwrap();
            let lossy = case["lossy"].as_bool().unwrap_or(false);
            assert_eq!(decoded == text, !lossy, "{text:?} decodes to {decoded:?}");
        }
        assert!(
            failures.is_empty(),
            "{} of {} cases differ:\n{}",
            failures.len(),
            cases.len(),
            failures.join("\n")
        );
    }
}
