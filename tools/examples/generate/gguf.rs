//! A small, fully bounds-checked reader for GGUF files (the llama.cpp/ggml model format).
//!
//! Why our own: no GGUF reader on crates.io both dequantizes the tensor types the example
//! loads (Q4_0 / Q4_1 / Q8_0 / F16 / BF16) and returns errors on a damaged file
//! (`gguf-rs-lib`, `gguf` and `gguf-rs` read metadata and tensor infos but not quantized data;
//! `ggus` with `ggml-quants` dequantizes, but its tensor-info reader unwraps and copies
//! unchecked lengths, so a truncated file panics; candle's pulls in a tensor library).
//!
//! # Format (little-endian throughout)
//!
//! ```text
//! header      magic "GGUF" (4 bytes), version u32 (2 or 3 here),
//!             tensor_count u64, metadata_kv_count u64
//! metadata    metadata_kv_count x { key: string, value_type: u32, value }
//! tensor info tensor_count x { name: string, n_dims: u32, dims: n_dims x u64,
//!                              ggml_type: u32, offset: u64 }
//! padding     up to a multiple of `general.alignment` (a u32 metadata value; 32 if absent)
//! data        tensor bytes; each tensor starts at data_offset + offset
//! ```
//!
//! A string is a u64 byte length followed by that many UTF-8 bytes (no terminator). A value
//! is one of the 13 GGUF value types (u8, i8, u16, i16, u32, i32, f32, bool, string, array,
//! u64, i64, f64); an array is an element type u32, a count u64 and the elements, and may
//! itself hold arrays. Dims are innermost-first: `dims[0]` (ggml's `ne0`) is the length of
//! a contiguous row. Quantized types pack `dims[0]` in blocks (32 elements for Q4_0, Q4_1,
//! Q8_0), so `dims[0]` must be a multiple of the block length.
//!
//! # Bounds this reader relies on and enforces
//!
//! The whole file is held in memory and every read goes through one cursor that checks
//! the remaining length before touching a byte, so a truncated file gives
//! [`GgufError::Truncated`] with the offset and the item being read, never a panic. Counts
//! read from the file (metadata entries, tensors, array elements, string lengths) are
//! checked against the bytes that remain before anything is allocated: each counted item
//! occupies at least a known number of bytes in the file (for example 8 for a string), so
//! a count larger than `remaining / min_size` is corrupt ([`GgufError::CountTooLarge`]).
//! Arrays nest at most [`MAX_ARRAY_DEPTH`] deep (bounding recursion), tensors have at most
//! [`MAX_DIMS`] dims, dims products and byte sizes use checked arithmetic, and every
//! tensor's byte range is checked against the file when it is opened, so later accessors
//! cannot read out of range. Strings must be valid UTF-8, booleans 0 or 1, keys and tensor
//! names unique, `general.alignment` a nonzero power of two of type u32, tensor offsets
//! multiples of it. Only little-endian files are read; a byte-swapped (big-endian) header
//! is recognised and reported as such.

use std::collections::HashMap;
use std::fmt;
use std::path::{Path, PathBuf};

use half::f16;

/// The four bytes every GGUF file starts with.
pub const GGUF_MAGIC: [u8; 4] = *b"GGUF";
/// Alignment of the tensor data section and of tensor offsets when `general.alignment` is absent.
pub const DEFAULT_ALIGNMENT: u64 = 32;
/// The metadata key that overrides [`DEFAULT_ALIGNMENT`].
pub const ALIGNMENT_KEY: &str = "general.alignment";
/// Most dims a tensor may have (ggml's `GGML_MAX_DIMS`).
pub const MAX_DIMS: usize = 4;
/// Deepest nesting of metadata arrays accepted (an array of arrays has depth 2).
pub const MAX_ARRAY_DEPTH: usize = 8;

/// Everything that can go wrong reading a GGUF file; each message says what and where.
#[derive(Debug, thiserror::Error)]
pub enum GgufError {
    /// The file could not be read from disk.
    #[error("cannot read GGUF file {path}: {source}")]
    Io {
        /// The path given to [`GgufFile::open`].
        path: PathBuf,
        /// The operating system's error.
        source: std::io::Error,
    },
    /// The first four bytes are not `GGUF`.
    #[error(
        "not a GGUF file: magic bytes are {found:02x?}, expected {GGUF_MAGIC:02x?} (\"GGUF\")"
    )]
    BadMagic {
        /// The four bytes found.
        found: [u8; 4],
    },
    /// A GGUF version other than 2 or 3.
    #[error("unsupported GGUF version {0} (this reader supports versions 2 and 3)")]
    UnsupportedVersion(u32),
    /// A byte-swapped version field: the file was written for a big-endian machine.
    #[error(
        "big-endian GGUF file (version {0} byte-swapped); only little-endian files are supported"
    )]
    BigEndian(u32),
    /// The file ends before an item that the header or an earlier count says is there.
    #[error("truncated GGUF file: reading {what} needs {needed} bytes at offset {offset}, but only {available} remain")]
    Truncated {
        /// What was being read.
        what: String,
        /// Byte offset of the read.
        offset: usize,
        /// Bytes the read needed.
        needed: u64,
        /// Bytes left in the file at `offset`.
        available: usize,
    },
    /// A count read from the file is larger than the rest of the file could possibly hold.
    #[error("corrupt GGUF file: {what} at offset {offset} is {count}, but each item takes at least {min_item_bytes} bytes and only {remaining} bytes remain")]
    CountTooLarge {
        /// What was being counted.
        what: String,
        /// Byte offset just after the count.
        offset: usize,
        /// The count read.
        count: u64,
        /// Fewest bytes one counted item occupies in the file.
        min_item_bytes: u64,
        /// Bytes left in the file after the count.
        remaining: usize,
    },
    /// A metadata value type id outside 0..=12.
    #[error(
        "corrupt GGUF file: unknown metadata value type {type_id} for {what} at offset {offset}"
    )]
    BadValueType {
        /// What was being read.
        what: String,
        /// Byte offset of the type id.
        offset: usize,
        /// The id read.
        type_id: u32,
    },
    /// A boolean byte other than 0 or 1.
    #[error(
        "corrupt GGUF file: boolean byte {byte} (expected 0 or 1) in {what} at offset {offset}"
    )]
    BadBool {
        /// What was being read.
        what: String,
        /// Byte offset of the byte.
        offset: usize,
        /// The byte read.
        byte: u8,
    },
    /// A string that is not UTF-8.
    #[error("corrupt GGUF file: {what} at offset {offset} is not valid UTF-8")]
    BadUtf8 {
        /// What was being read.
        what: String,
        /// Byte offset of the string's bytes.
        offset: usize,
    },
    /// Arrays nested more than [`MAX_ARRAY_DEPTH`] deep.
    #[error("corrupt GGUF file: arrays nested more than {MAX_ARRAY_DEPTH} deep in {what} at offset {offset}")]
    NestingTooDeep {
        /// What was being read.
        what: String,
        /// Byte offset of the innermost array header.
        offset: usize,
    },
    /// The same metadata key twice.
    #[error("corrupt GGUF file: duplicate metadata key {0:?}")]
    DuplicateKey(String),
    /// The same tensor name twice.
    #[error("corrupt GGUF file: duplicate tensor name {0:?}")]
    DuplicateTensor(String),
    /// `general.alignment` is zero or not a power of two.
    #[error("corrupt GGUF file: general.alignment is {0}, expected a nonzero power of two")]
    BadAlignment(u64),
    /// A tensor with more than [`MAX_DIMS`] dims.
    #[error(
        "corrupt GGUF file: tensor {name:?} has {n_dims} dims, at most {MAX_DIMS} are allowed"
    )]
    TooManyDims {
        /// The tensor.
        name: String,
        /// Its dims count.
        n_dims: u32,
    },
    /// The product of a tensor's dims (or its byte size) does not fit in 64 bits / `usize`.
    #[error(
        "corrupt GGUF file: tensor {name:?} dims {dims:?}: element count or byte size overflows"
    )]
    DimsOverflow {
        /// The tensor.
        name: String,
        /// Its dims, GGUF order.
        dims: Vec<u64>,
    },
    /// A ggml type id this reader does not know the block layout of.
    #[error("tensor {name:?}: unknown ggml type id {type_id}")]
    UnknownGgmlType {
        /// The tensor.
        name: String,
        /// The type id read.
        type_id: u32,
    },
    /// The row length of a block-quantized tensor is not a whole number of blocks.
    #[error("corrupt GGUF file: tensor {name:?} of type {ty} has row length {row_len}, not a multiple of the block length {block_len}")]
    PartialBlock {
        /// The tensor.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
        /// `dims[0]`.
        row_len: u64,
        /// Elements per block of `ty`.
        block_len: u64,
    },
    /// A tensor offset that is not a multiple of the alignment.
    #[error("corrupt GGUF file: tensor {name:?} offset {offset} is not a multiple of the alignment {alignment}")]
    MisalignedTensor {
        /// The tensor.
        name: String,
        /// Its offset relative to the data section.
        offset: u64,
        /// The file's alignment.
        alignment: u64,
    },
    /// A tensor's bytes do not lie inside the file.
    #[error("tensor {name:?}: data at file bytes {start}..{end} is out of range, the file has {file_len} bytes")]
    DataOutOfRange {
        /// The tensor.
        name: String,
        /// Absolute start offset (computed without overflow).
        start: u128,
        /// Absolute end offset, exclusive.
        end: u128,
        /// File length.
        file_len: usize,
    },
    /// No tensor of that name.
    #[error("unknown tensor {0:?}")]
    UnknownTensor(String),
    /// [`GgufFile::tensor_f32`] on a type it cannot dequantize.
    #[error("tensor {name:?}: unsupported ggml type {ty} (tensor_f32 reads F32, F16, BF16, Q8_0, Q4_0, Q4_1)")]
    UnsupportedType {
        /// The tensor.
        name: String,
        /// Its ggml type.
        ty: GgmlType,
    },
    /// A metadata key that is absent.
    #[error("metadata key {0:?} not found")]
    MissingKey(String),
    /// A metadata value of another type than the getter's.
    #[error("metadata key {key:?}: expected {expected}, found {actual}")]
    WrongType {
        /// The key.
        key: String,
        /// The type the getter reads.
        expected: String,
        /// The type in the file.
        actual: String,
    },
    /// An integer metadata value that does not fit the getter's type.
    #[error("metadata key {key:?}: value {value} does not fit in {target}")]
    OutOfRange {
        /// The key.
        key: String,
        /// The value, printed.
        value: String,
        /// The target type.
        target: &'static str,
    },
}

/// The type of a metadata value (its GGUF type id is [`ValueType::id`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum ValueType {
    /// 0: unsigned 8-bit integer.
    U8,
    /// 1: signed 8-bit integer.
    I8,
    /// 2: unsigned 16-bit integer.
    U16,
    /// 3: signed 16-bit integer.
    I16,
    /// 4: unsigned 32-bit integer.
    U32,
    /// 5: signed 32-bit integer.
    I32,
    /// 6: IEEE 754 binary32.
    F32,
    /// 7: one byte, 0 or 1.
    Bool,
    /// 8: u64 length + UTF-8 bytes.
    String,
    /// 9: element type u32 + count u64 + elements.
    Array,
    /// 10: unsigned 64-bit integer.
    U64,
    /// 11: signed 64-bit integer.
    I64,
    /// 12: IEEE 754 binary64.
    F64,
}

impl ValueType {
    /// The type for a GGUF type id, `None` outside 0..=12.
    pub fn from_id(id: u32) -> Option<Self> {
        use ValueType::*;
        Some(match id {
            0 => U8,
            1 => I8,
            2 => U16,
            3 => I16,
            4 => U32,
            5 => I32,
            6 => F32,
            7 => Bool,
            8 => String,
            9 => Array,
            10 => U64,
            11 => I64,
            12 => F64,
            _ => return None,
        })
    }

    /// The GGUF type id.
    pub fn id(self) -> u32 {
        use ValueType::*;
        match self {
            U8 => 0,
            I8 => 1,
            U16 => 2,
            I16 => 3,
            U32 => 4,
            I32 => 5,
            F32 => 6,
            Bool => 7,
            String => 8,
            Array => 9,
            U64 => 10,
            I64 => 11,
            F64 => 12,
        }
    }

    /// Lower-case name (`"u32"`, `"string"`, ...).
    pub fn name(self) -> &'static str {
        use ValueType::*;
        match self {
            U8 => "u8",
            I8 => "i8",
            U16 => "u16",
            I16 => "i16",
            U32 => "u32",
            I32 => "i32",
            F32 => "f32",
            Bool => "bool",
            String => "string",
            Array => "array",
            U64 => "u64",
            I64 => "i64",
            F64 => "f64",
        }
    }

    /// Fewest bytes a value of this type occupies in a file (an empty string: 8, an empty
    /// array: 12).
    fn min_encoded_size(self) -> u64 {
        use ValueType::*;
        match self {
            U8 | I8 | Bool => 1,
            U16 | I16 => 2,
            U32 | I32 | F32 => 4,
            U64 | I64 | F64 | String => 8,
            Array => 12,
        }
    }
}

impl fmt::Display for ValueType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.name())
    }
}

/// A metadata array: the elements of one type, stored unboxed.
#[derive(Debug, Clone, PartialEq)]
pub enum Array {
    /// u8 elements.
    U8(Vec<u8>),
    /// i8 elements.
    I8(Vec<i8>),
    /// u16 elements.
    U16(Vec<u16>),
    /// i16 elements.
    I16(Vec<i16>),
    /// u32 elements.
    U32(Vec<u32>),
    /// i32 elements.
    I32(Vec<i32>),
    /// f32 elements.
    F32(Vec<f32>),
    /// bool elements.
    Bool(Vec<bool>),
    /// string elements.
    String(Vec<String>),
    /// Nested arrays (element type [`ValueType::Array`]); each may have its own element type.
    Nested(Vec<Array>),
    /// u64 elements.
    U64(Vec<u64>),
    /// i64 elements.
    I64(Vec<i64>),
    /// f64 elements.
    F64(Vec<f64>),
}

impl Array {
    /// The element type.
    pub fn element_type(&self) -> ValueType {
        match self {
            Array::U8(_) => ValueType::U8,
            Array::I8(_) => ValueType::I8,
            Array::U16(_) => ValueType::U16,
            Array::I16(_) => ValueType::I16,
            Array::U32(_) => ValueType::U32,
            Array::I32(_) => ValueType::I32,
            Array::F32(_) => ValueType::F32,
            Array::Bool(_) => ValueType::Bool,
            Array::String(_) => ValueType::String,
            Array::Nested(_) => ValueType::Array,
            Array::U64(_) => ValueType::U64,
            Array::I64(_) => ValueType::I64,
            Array::F64(_) => ValueType::F64,
        }
    }

    /// Number of elements.
    pub fn len(&self) -> usize {
        match self {
            Array::U8(v) => v.len(),
            Array::I8(v) => v.len(),
            Array::U16(v) => v.len(),
            Array::I16(v) => v.len(),
            Array::U32(v) => v.len(),
            Array::I32(v) => v.len(),
            Array::F32(v) => v.len(),
            Array::Bool(v) => v.len(),
            Array::String(v) => v.len(),
            Array::Nested(v) => v.len(),
            Array::U64(v) => v.len(),
            Array::I64(v) => v.len(),
            Array::F64(v) => v.len(),
        }
    }

    /// Whether there are no elements.
    pub fn is_empty(&self) -> bool {
        self.len() == 0
    }

    /// `"array of <element type>"`.
    pub fn type_name(&self) -> String {
        format!("array of {}", self.element_type())
    }
}

/// One metadata value.
#[derive(Debug, Clone, PartialEq)]
pub enum Value {
    /// u8.
    U8(u8),
    /// i8.
    I8(i8),
    /// u16.
    U16(u16),
    /// i16.
    I16(i16),
    /// u32.
    U32(u32),
    /// i32.
    I32(i32),
    /// f32.
    F32(f32),
    /// bool.
    Bool(bool),
    /// UTF-8 string.
    String(String),
    /// Array (see [`Array`]).
    Array(Array),
    /// u64.
    U64(u64),
    /// i64.
    I64(i64),
    /// f64.
    F64(f64),
}

impl Value {
    /// The value's type.
    pub fn value_type(&self) -> ValueType {
        match self {
            Value::U8(_) => ValueType::U8,
            Value::I8(_) => ValueType::I8,
            Value::U16(_) => ValueType::U16,
            Value::I16(_) => ValueType::I16,
            Value::U32(_) => ValueType::U32,
            Value::I32(_) => ValueType::I32,
            Value::F32(_) => ValueType::F32,
            Value::Bool(_) => ValueType::Bool,
            Value::String(_) => ValueType::String,
            Value::Array(_) => ValueType::Array,
            Value::U64(_) => ValueType::U64,
            Value::I64(_) => ValueType::I64,
            Value::F64(_) => ValueType::F64,
        }
    }

    /// The type's name, arrays with their element type (`"array of string"`).
    pub fn type_name(&self) -> String {
        match self {
            Value::Array(a) => a.type_name(),
            other => other.value_type().name().to_string(),
        }
    }

    /// An integer value of any integer type, widened to i128; `None` for other types.
    pub fn as_integer(&self) -> Option<i128> {
        Some(match *self {
            Value::U8(v) => v.into(),
            Value::I8(v) => v.into(),
            Value::U16(v) => v.into(),
            Value::I16(v) => v.into(),
            Value::U32(v) => v.into(),
            Value::I32(v) => v.into(),
            Value::U64(v) => v.into(),
            Value::I64(v) => v.into(),
            _ => return None,
        })
    }
}

/// A ggml tensor element type, by its id in the file (`GgmlType::Q4_1.0 == 3`).
///
/// Only the types in [`GgmlType::block_layout`]'s table can appear in a file this reader
/// opens (it needs the layout to check each tensor's byte range); [`GgufFile::tensor_f32`]
/// dequantizes F32, F16, BF16, Q8_0, Q4_0 and Q4_1.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub struct GgmlType(pub u32);

/// (id, name, elements per block, bytes per block), from ggml's type traits.
/// Q8_1 (id 9) is left out on purpose: it is an in-memory activation format that never
/// appears in files, and its block size has differed between ggml and gguf-py.
const GGML_TYPES: &[(u32, &str, u64, u64)] = &[
    (0, "F32", 1, 4),
    (1, "F16", 1, 2),
    (2, "Q4_0", 32, 18),
    (3, "Q4_1", 32, 20),
    (6, "Q5_0", 32, 22),
    (7, "Q5_1", 32, 24),
    (8, "Q8_0", 32, 34),
    (10, "Q2_K", 256, 84),
    (11, "Q3_K", 256, 110),
    (12, "Q4_K", 256, 144),
    (13, "Q5_K", 256, 176),
    (14, "Q6_K", 256, 210),
    (15, "Q8_K", 256, 292),
    (16, "IQ2_XXS", 256, 66),
    (17, "IQ2_XS", 256, 74),
    (18, "IQ3_XXS", 256, 98),
    (19, "IQ1_S", 256, 50),
    (20, "IQ4_NL", 32, 18),
    (21, "IQ3_S", 256, 110),
    (22, "IQ2_S", 256, 82),
    (23, "IQ4_XS", 256, 136),
    (24, "I8", 1, 1),
    (25, "I16", 1, 2),
    (26, "I32", 1, 4),
    (27, "I64", 1, 8),
    (28, "F64", 1, 8),
    (29, "IQ1_M", 256, 56),
    (30, "BF16", 1, 2),
    (34, "TQ1_0", 256, 54),
    (35, "TQ2_0", 256, 66),
    (39, "MXFP4", 32, 17),
];

impl GgmlType {
    /// 32-bit float.
    pub const F32: GgmlType = GgmlType(0);
    /// IEEE half.
    pub const F16: GgmlType = GgmlType(1);
    /// Blocks of 32: f16 scale d, 16 bytes of 4-bit q; x = d * (q - 8).
    pub const Q4_0: GgmlType = GgmlType(2);
    /// Blocks of 32: f16 scale d, f16 min m, 16 bytes of 4-bit q; x = d * q + m.
    pub const Q4_1: GgmlType = GgmlType(3);
    /// Blocks of 32: f16 scale d, 32 i8 q; x = d * q.
    pub const Q8_0: GgmlType = GgmlType(8);
    /// A k-quant (not dequantized here; named for tests and messages).
    pub const Q4_K: GgmlType = GgmlType(12);
    /// bfloat16.
    pub const BF16: GgmlType = GgmlType(30);

    fn entry(self) -> Option<&'static (u32, &'static str, u64, u64)> {
        GGML_TYPES.iter().find(|e| e.0 == self.0)
    }

    /// ggml's name of the type (`"Q4_1"`), `None` for an id not in the table.
    pub fn name(self) -> Option<&'static str> {
        self.entry().map(|e| e.1)
    }

    /// (elements per block, bytes per block), `None` for an id not in the table.
    pub fn block_layout(self) -> Option<(u64, u64)> {
        self.entry().map(|e| (e.2, e.3))
    }
}

impl fmt::Display for GgmlType {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self.name() {
            Some(name) => f.write_str(name),
            None => write!(f, "ggml type {}", self.0),
        }
    }
}

/// One tensor's description from the tensor-info section, validated against the file.
#[derive(Debug, Clone, PartialEq)]
pub struct TensorInfo {
    /// The tensor's name.
    pub name: String,
    /// Dims, GGUF order: `dims[0]` is the innermost (contiguous) length.
    pub dims: Vec<usize>,
    /// Element type.
    pub ggml_type: GgmlType,
    /// Offset of the data relative to the start of the data section.
    pub offset: u64,
    /// Product of the dims (1 for zero dims).
    pub n_elements: usize,
    /// Bytes of data.
    pub n_bytes: usize,
}

/// A parsed GGUF file: its bytes, metadata and validated tensor table.
#[derive(Debug, Clone)]
pub struct GgufFile {
    bytes: Vec<u8>,
    version: u32,
    metadata: Vec<(String, Value)>,
    metadata_index: HashMap<String, usize>,
    tensors: Vec<TensorInfo>,
    tensor_index: HashMap<String, usize>,
    alignment: u64,
    data_offset: usize,
}

/// A bounds-checked little-endian cursor over the file.
struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
}

impl<'a> Reader<'a> {
    fn remaining(&self) -> usize {
        self.buf.len() - self.pos
    }

    fn take(&mut self, n: u64, what: &dyn Fn() -> String) -> Result<&'a [u8], GgufError> {
        let available = self.remaining();
        match usize::try_from(n) {
            Ok(n) if n <= available => {
                let out = &self.buf[self.pos..self.pos + n];
                self.pos += n;
                Ok(out)
            }
            _ => Err(GgufError::Truncated {
                what: what(),
                offset: self.pos,
                needed: n,
                available,
            }),
        }
    }

    fn array<const N: usize>(&mut self, what: &dyn Fn() -> String) -> Result<[u8; N], GgufError> {
        let bytes = self.take(N as u64, what)?;
        let mut out = [0u8; N];
        out.copy_from_slice(bytes);
        Ok(out)
    }

    fn u32(&mut self, what: &dyn Fn() -> String) -> Result<u32, GgufError> {
        self.array(what).map(u32::from_le_bytes)
    }

    fn u64(&mut self, what: &dyn Fn() -> String) -> Result<u64, GgufError> {
        self.array(what).map(u64::from_le_bytes)
    }

    /// Reads a count and checks that `count` items of at least `min_item_bytes` each fit
    /// in the rest of the file.
    fn count(
        &mut self,
        min_item_bytes: u64,
        what: &dyn Fn() -> String,
    ) -> Result<usize, GgufError> {
        let count = self.u64(what)?;
        let remaining = self.remaining();
        let fits = count
            .checked_mul(min_item_bytes)
            .is_some_and(|need| need <= remaining as u64);
        match usize::try_from(count) {
            Ok(n) if fits => Ok(n),
            _ => Err(GgufError::CountTooLarge {
                what: what(),
                offset: self.pos,
                count,
                min_item_bytes,
                remaining,
            }),
        }
    }

    fn string(&mut self, what: &dyn Fn() -> String) -> Result<String, GgufError> {
        let len = self.u64(&|| format!("length of {}", what()))?;
        let offset = self.pos;
        let bytes = self.take(len, what)?;
        match std::str::from_utf8(bytes) {
            Ok(s) => Ok(s.to_owned()),
            Err(_) => Err(GgufError::BadUtf8 {
                what: what(),
                offset,
            }),
        }
    }

    fn value_type(&mut self, what: &dyn Fn() -> String) -> Result<ValueType, GgufError> {
        let offset = self.pos;
        let type_id = self.u32(&|| format!("value type of {}", what()))?;
        ValueType::from_id(type_id).ok_or_else(|| GgufError::BadValueType {
            what: what(),
            offset,
            type_id,
        })
    }

    fn bool(&mut self, what: &dyn Fn() -> String) -> Result<bool, GgufError> {
        let offset = self.pos;
        match self.array::<1>(what)?[0] {
            0 => Ok(false),
            1 => Ok(true),
            byte => Err(GgufError::BadBool {
                what: what(),
                offset,
                byte,
            }),
        }
    }

    /// One value of type `ty`; `depth` counts the arrays around it.
    fn value(
        &mut self,
        ty: ValueType,
        depth: usize,
        what: &dyn Fn() -> String,
    ) -> Result<Value, GgufError> {
        Ok(match ty {
            ValueType::U8 => Value::U8(u8::from_le_bytes(self.array(what)?)),
            ValueType::I8 => Value::I8(i8::from_le_bytes(self.array(what)?)),
            ValueType::U16 => Value::U16(u16::from_le_bytes(self.array(what)?)),
            ValueType::I16 => Value::I16(i16::from_le_bytes(self.array(what)?)),
            ValueType::U32 => Value::U32(u32::from_le_bytes(self.array(what)?)),
            ValueType::I32 => Value::I32(i32::from_le_bytes(self.array(what)?)),
            ValueType::F32 => Value::F32(f32::from_le_bytes(self.array(what)?)),
            ValueType::Bool => Value::Bool(self.bool(what)?),
            ValueType::String => Value::String(self.string(what)?),
            ValueType::Array => Value::Array(self.array_value(depth + 1, what)?),
            ValueType::U64 => Value::U64(u64::from_le_bytes(self.array(what)?)),
            ValueType::I64 => Value::I64(i64::from_le_bytes(self.array(what)?)),
            ValueType::F64 => Value::F64(f64::from_le_bytes(self.array(what)?)),
        })
    }

    /// An array header and its elements; `depth` is 1 for an outermost array.
    fn array_value(&mut self, depth: usize, what: &dyn Fn() -> String) -> Result<Array, GgufError> {
        if depth > MAX_ARRAY_DEPTH {
            return Err(GgufError::NestingTooDeep {
                what: what(),
                offset: self.pos,
            });
        }
        let elem = self.value_type(&|| format!("element type of {}", what()))?;
        let n = self.count(elem.min_encoded_size(), &|| {
            format!("element count of {}", what())
        })?;
        let elem_what = || format!("element of {}", what());
        fn fixed<T, const N: usize>(
            r: &mut Reader<'_>,
            n: usize,
            what: &dyn Fn() -> String,
            conv: fn([u8; N]) -> T,
        ) -> Result<Vec<T>, GgufError> {
            // `count` checked n * N <= remaining, so this allocation is bounded by the file.
            let bytes = r.take((n * N) as u64, what)?;
            Ok(bytes
                .chunks_exact(N)
                .map(|c| {
                    let mut a = [0u8; N];
                    a.copy_from_slice(c);
                    conv(a)
                })
                .collect())
        }
        Ok(match elem {
            ValueType::U8 => Array::U8(fixed(self, n, &elem_what, u8::from_le_bytes)?),
            ValueType::I8 => Array::I8(fixed(self, n, &elem_what, i8::from_le_bytes)?),
            ValueType::U16 => Array::U16(fixed(self, n, &elem_what, u16::from_le_bytes)?),
            ValueType::I16 => Array::I16(fixed(self, n, &elem_what, i16::from_le_bytes)?),
            ValueType::U32 => Array::U32(fixed(self, n, &elem_what, u32::from_le_bytes)?),
            ValueType::I32 => Array::I32(fixed(self, n, &elem_what, i32::from_le_bytes)?),
            ValueType::F32 => Array::F32(fixed(self, n, &elem_what, f32::from_le_bytes)?),
            ValueType::U64 => Array::U64(fixed(self, n, &elem_what, u64::from_le_bytes)?),
            ValueType::I64 => Array::I64(fixed(self, n, &elem_what, i64::from_le_bytes)?),
            ValueType::F64 => Array::F64(fixed(self, n, &elem_what, f64::from_le_bytes)?),
            ValueType::Bool => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.bool(&elem_what)?);
                }
                Array::Bool(v)
            }
            ValueType::String => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.string(&elem_what)?);
                }
                Array::String(v)
            }
            ValueType::Array => {
                let mut v = Vec::with_capacity(n);
                for _ in 0..n {
                    v.push(self.array_value(depth + 1, &elem_what)?);
                }
                Array::Nested(v)
            }
        })
    }
}

/// Smallest tensor-info record: name length (8), n_dims (4), type (4), offset (8).
const MIN_TENSOR_INFO_BYTES: u64 = 24;
/// Smallest metadata entry: key length (8), value type (4), a one-byte value.
const MIN_KV_BYTES: u64 = 13;

macro_rules! scalar_getter {
    ($(#[$doc:meta])* $fn_name:ident, $variant:ident, $ty:ty) => {
        $(#[$doc])*
        pub fn $fn_name(&self, key: &str) -> Result<$ty, GgufError> {
            match self.require(key)? {
                Value::$variant(v) => Ok(*v),
                other => Err(wrong_type(key, ValueType::$variant.name(), other)),
            }
        }
    };
}

fn wrong_type(key: &str, expected: &str, actual: &Value) -> GgufError {
    GgufError::WrongType {
        key: key.to_string(),
        expected: expected.to_string(),
        actual: actual.type_name(),
    }
}

impl GgufFile {
    /// Reads the whole file at `path` into memory and parses it (see [`GgufFile::parse`]).
    pub fn open(path: impl AsRef<Path>) -> Result<Self, GgufError> {
        let path = path.as_ref();
        let bytes = std::fs::read(path).map_err(|source| GgufError::Io {
            path: path.to_path_buf(),
            source,
        })?;
        Self::parse(bytes)
    }

    /// Parses a GGUF v2/v3 file held in memory: header, metadata, tensor infos, and checks
    /// that every tensor's data lies inside `bytes`. Never panics; any inconsistency is an
    /// error naming what was being read and where.
    pub fn parse(bytes: Vec<u8>) -> Result<Self, GgufError> {
        let mut file = Self::read_layout(&bytes)?;
        file.bytes = bytes;
        Ok(file)
    }

    /// Everything but the bytes themselves: header, metadata, tensor table, data offset.
    fn read_layout(bytes: &[u8]) -> Result<Self, GgufError> {
        let mut r = Reader { buf: bytes, pos: 0 };
        let magic: [u8; 4] = r.array(&|| "magic".to_string())?;
        if magic != GGUF_MAGIC {
            return Err(GgufError::BadMagic { found: magic });
        }
        let version = r.u32(&|| "version".to_string())?;
        match version {
            2 | 3 => {}
            v if matches!(v.swap_bytes(), 1..=3) => {
                return Err(GgufError::BigEndian(v.swap_bytes()))
            }
            v => return Err(GgufError::UnsupportedVersion(v)),
        }
        let tensor_count = r.u64(&|| "tensor count".to_string())?;
        let kv_count = r.count(MIN_KV_BYTES, &|| "metadata entry count".to_string())?;
        // Checked against all that follows the metadata count (a loose but sufficient bound).
        let remaining = r.remaining();
        if tensor_count
            .checked_mul(MIN_TENSOR_INFO_BYTES)
            .is_none_or(|need| need > remaining as u64)
        {
            return Err(GgufError::CountTooLarge {
                what: "tensor count".to_string(),
                offset: 16,
                count: tensor_count,
                min_item_bytes: MIN_TENSOR_INFO_BYTES,
                remaining,
            });
        }
        let tensor_count = tensor_count as usize; // <= file length / 24

        let mut metadata = Vec::with_capacity(kv_count);
        let mut metadata_index = HashMap::with_capacity(kv_count);
        for i in 0..kv_count {
            let key = r.string(&|| format!("key of metadata entry #{i}"))?;
            let what = || format!("value of metadata key {key:?}");
            let ty = r.value_type(&what)?;
            let value = r.value(ty, 0, &what)?;
            if metadata_index.insert(key.clone(), i).is_some() {
                return Err(GgufError::DuplicateKey(key));
            }
            metadata.push((key, value));
        }

        let alignment = match metadata_index.get(ALIGNMENT_KEY).map(|&i| &metadata[i].1) {
            None => DEFAULT_ALIGNMENT,
            Some(Value::U32(a)) if a.is_power_of_two() => u64::from(*a),
            Some(Value::U32(a)) => return Err(GgufError::BadAlignment(u64::from(*a))),
            Some(other) => return Err(wrong_type(ALIGNMENT_KEY, "u32", other)),
        };

        let mut tensors = Vec::with_capacity(tensor_count);
        let mut tensor_index = HashMap::with_capacity(tensor_count);
        for i in 0..tensor_count {
            let info = read_tensor_info(&mut r, i, alignment)?;
            if tensor_index.insert(info.name.clone(), i).is_some() {
                return Err(GgufError::DuplicateTensor(info.name));
            }
            tensors.push(info);
        }

        // Data section: the end of the tensor infos rounded up to the alignment. Computed
        // in u128 so that neither this nor the ranges below can overflow.
        let align = u128::from(alignment);
        let data_offset = (r.pos as u128).div_ceil(align) * align;
        for t in &tensors {
            let start = data_offset + u128::from(t.offset);
            let end = start + t.n_bytes as u128;
            if end > bytes.len() as u128 {
                return Err(GgufError::DataOutOfRange {
                    name: t.name.clone(),
                    start,
                    end,
                    file_len: bytes.len(),
                });
            }
        }
        // With no tensors the padding may be missing; clamp so offsets stay in range.
        let data_offset = data_offset.min(bytes.len() as u128) as usize;
        Ok(GgufFile {
            bytes: Vec::new(),
            version,
            metadata,
            metadata_index,
            tensors,
            tensor_index,
            alignment,
            data_offset,
        })
    }

    /// The GGUF version (2 or 3).
    pub fn version(&self) -> u32 {
        self.version
    }

    /// The alignment of the data section and tensor offsets.
    pub fn alignment(&self) -> u64 {
        self.alignment
    }

    /// Absolute byte offset of the tensor data section.
    pub fn data_offset(&self) -> usize {
        self.data_offset
    }

    /// The file's bytes.
    pub fn bytes(&self) -> &[u8] {
        &self.bytes
    }

    /// The value of a metadata key.
    pub fn metadata(&self, key: &str) -> Option<&Value> {
        self.metadata_index.get(key).map(|&i| &self.metadata[i].1)
    }

    /// All metadata entries, in file order.
    pub fn metadata_entries(&self) -> impl Iterator<Item = (&str, &Value)> + '_ {
        self.metadata.iter().map(|(k, v)| (k.as_str(), v))
    }

    fn require(&self, key: &str) -> Result<&Value, GgufError> {
        self.metadata(key)
            .ok_or_else(|| GgufError::MissingKey(key.to_string()))
    }

    scalar_getter!(
        /// A u8 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_u8, U8, u8
    );
    scalar_getter!(
        /// An i8 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_i8, I8, i8
    );
    scalar_getter!(
        /// A u16 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_u16, U16, u16
    );
    scalar_getter!(
        /// An i16 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_i16, I16, i16
    );
    scalar_getter!(
        /// A u32 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_u32, U32, u32
    );
    scalar_getter!(
        /// An i32 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_i32, I32, i32
    );
    scalar_getter!(
        /// A u64 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_u64, U64, u64
    );
    scalar_getter!(
        /// An i64 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_i64, I64, i64
    );
    scalar_getter!(
        /// An f32 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_f32, F32, f32
    );
    scalar_getter!(
        /// An f64 value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_f64, F64, f64
    );
    scalar_getter!(
        /// A bool value; [`GgufError::MissingKey`] or [`GgufError::WrongType`] otherwise.
        get_bool, Bool, bool
    );

    /// A value of any integer type that fits in `usize` (hyperparameters are u32 in
    /// llama.cpp's files but u64 in some others); [`GgufError::OutOfRange`] if it does not fit.
    pub fn get_usize(&self, key: &str) -> Result<usize, GgufError> {
        let value = self.require(key)?;
        let int = value
            .as_integer()
            .ok_or_else(|| wrong_type(key, "an integer", value))?;
        usize::try_from(int).map_err(|_| GgufError::OutOfRange {
            key: key.to_string(),
            value: int.to_string(),
            target: "usize",
        })
    }

    /// A string value.
    pub fn get_str(&self, key: &str) -> Result<&str, GgufError> {
        match self.require(key)? {
            Value::String(s) => Ok(s),
            other => Err(wrong_type(key, "string", other)),
        }
    }

    /// An array value of any element type.
    pub fn get_array(&self, key: &str) -> Result<&Array, GgufError> {
        match self.require(key)? {
            Value::Array(a) => Ok(a),
            other => Err(wrong_type(key, "array", other)),
        }
    }

    /// An array of strings.
    pub fn get_str_array(&self, key: &str) -> Result<&[String], GgufError> {
        match self.require(key)? {
            Value::Array(Array::String(v)) => Ok(v),
            other => Err(wrong_type(key, "array of string", other)),
        }
    }

    /// An array of i32.
    pub fn get_i32_array(&self, key: &str) -> Result<&[i32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::I32(v)) => Ok(v),
            other => Err(wrong_type(key, "array of i32", other)),
        }
    }

    /// An array of u32.
    pub fn get_u32_array(&self, key: &str) -> Result<&[u32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::U32(v)) => Ok(v),
            other => Err(wrong_type(key, "array of u32", other)),
        }
    }

    /// An array of f32.
    pub fn get_f32_array(&self, key: &str) -> Result<&[f32], GgufError> {
        match self.require(key)? {
            Value::Array(Array::F32(v)) => Ok(v),
            other => Err(wrong_type(key, "array of f32", other)),
        }
    }

    /// Number of tensors.
    pub fn tensor_count(&self) -> usize {
        self.tensors.len()
    }

    /// Tensor names, in file order.
    pub fn tensor_names(&self) -> impl Iterator<Item = &str> + '_ {
        self.tensors.iter().map(|t| t.name.as_str())
    }

    /// All tensor infos, in file order.
    pub fn tensor_infos(&self) -> &[TensorInfo] {
        &self.tensors
    }

    /// One tensor's info; [`GgufError::UnknownTensor`] if there is none of that name.
    pub fn tensor_info(&self, name: &str) -> Result<&TensorInfo, GgufError> {
        self.tensor_index
            .get(name)
            .map(|&i| &self.tensors[i])
            .ok_or_else(|| GgufError::UnknownTensor(name.to_string()))
    }

    /// A tensor's raw bytes (in range: checked by [`GgufFile::parse`]).
    pub fn tensor_bytes(&self, name: &str) -> Result<&[u8], GgufError> {
        let info = self.tensor_info(name)?;
        let start = self.data_offset + info.offset as usize;
        Ok(&self.bytes[start..start + info.n_bytes])
    }

    /// A tensor dequantized to f32, with its dims in GGUF order (`dims[0]` innermost; the
    /// values are laid out row-major with `dims[0]` contiguous). Reads F32, F16, BF16,
    /// Q8_0, Q4_0 and Q4_1; other types give [`GgufError::UnsupportedType`].
    pub fn tensor_f32(&self, name: &str) -> Result<(Vec<f32>, Vec<usize>), GgufError> {
        let info = self.tensor_info(name)?;
        let bytes = self.tensor_bytes(name)?;
        let values =
            dequantize(info.ggml_type, bytes).ok_or_else(|| GgufError::UnsupportedType {
                name: name.to_string(),
                ty: info.ggml_type,
            })?;
        Ok((values, info.dims.clone()))
    }
}

/// One tensor-info record (`i` is its index, for messages), with its element count and
/// byte size computed and checked; the data range is checked by the caller.
fn read_tensor_info(r: &mut Reader<'_>, i: usize, alignment: u64) -> Result<TensorInfo, GgufError> {
    let name = r.string(&|| format!("name of tensor #{i}"))?;
    let n_dims = r.u32(&|| format!("dims count of tensor {name:?}"))?;
    if n_dims as usize > MAX_DIMS {
        return Err(GgufError::TooManyDims { name, n_dims });
    }
    let mut dims = Vec::with_capacity(n_dims as usize);
    for d in 0..n_dims {
        dims.push(r.u64(&|| format!("dim {d} of tensor {name:?}"))?);
    }
    let type_id = r.u32(&|| format!("ggml type of tensor {name:?}"))?;
    let offset = r.u64(&|| format!("data offset of tensor {name:?}"))?;
    let ggml_type = GgmlType(type_id);
    let Some((block_len, block_bytes)) = ggml_type.block_layout() else {
        return Err(GgufError::UnknownGgmlType { name, type_id });
    };
    let row_len = dims.first().copied().unwrap_or(1);
    if row_len % block_len != 0 {
        return Err(GgufError::PartialBlock {
            name,
            ty: ggml_type,
            row_len,
            block_len,
        });
    }
    let sizes = dims
        .iter()
        .try_fold(1u64, |acc, &d| acc.checked_mul(d))
        .and_then(|n| Some((n, (n / block_len).checked_mul(block_bytes)?)))
        .and_then(|(n, b)| Some((usize::try_from(n).ok()?, usize::try_from(b).ok()?)));
    let dims_usize: Option<Vec<usize>> = dims.iter().map(|&d| usize::try_from(d).ok()).collect();
    let (Some((n_elements, n_bytes)), Some(dims_usize)) = (sizes, dims_usize) else {
        return Err(GgufError::DimsOverflow { name, dims });
    };
    if offset % alignment != 0 {
        return Err(GgufError::MisalignedTensor {
            name,
            offset,
            alignment,
        });
    }
    Ok(TensorInfo {
        name,
        dims: dims_usize,
        ggml_type,
        offset,
        n_elements,
        n_bytes,
    })
}

fn f16_at(b: &[u8], i: usize) -> f32 {
    f16::from_bits(u16::from_le_bytes([b[i], b[i + 1]])).to_f32()
}

/// Dequantizes whole blocks of `ty` (the caller's byte count is a whole number of blocks,
/// as [`GgufFile::parse`] checked); `None` for a type not handled here.
fn dequantize(ty: GgmlType, bytes: &[u8]) -> Option<Vec<f32>> {
    let (block_len, block_bytes) = ty.block_layout()?;
    let (block_len, block_bytes) = (block_len as usize, block_bytes as usize);
    let mut out = Vec::with_capacity(bytes.len() / block_bytes * block_len);
    let blocks = bytes.chunks_exact(block_bytes);
    match ty {
        GgmlType::F32 => out.extend(blocks.map(|b| f32::from_le_bytes([b[0], b[1], b[2], b[3]]))),
        GgmlType::F16 => out.extend(blocks.map(|b| f16_at(b, 0))),
        GgmlType::BF16 => out.extend(
            blocks.map(|b| f32::from_bits(u32::from(u16::from_le_bytes([b[0], b[1]])) << 16)),
        ),
        GgmlType::Q8_0 => {
            for b in blocks {
                let d = f16_at(b, 0);
                out.extend(b[2..34].iter().map(|&q| d * f32::from(q as i8)));
            }
        }
        GgmlType::Q4_0 => {
            for b in blocks {
                let d = f16_at(b, 0);
                let qs = &b[2..18];
                out.extend(qs.iter().map(|&q| d * f32::from((q & 0x0f) as i8 - 8)));
                out.extend(qs.iter().map(|&q| d * f32::from((q >> 4) as i8 - 8)));
            }
        }
        GgmlType::Q4_1 => {
            for b in blocks {
                let (d, m) = (f16_at(b, 0), f16_at(b, 2));
                let qs = &b[4..20];
                out.extend(qs.iter().map(|&q| d * f32::from(q & 0x0f) + m));
                out.extend(qs.iter().map(|&q| d * f32::from(q >> 4) + m));
            }
        }
        _ => return None,
    }
    Some(out)
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use std::path::PathBuf;
    use std::sync::OnceLock;

    /// Where the real SmolLM2 file is looked for: `$POLYATTN_SMOLLM2_GGUF`, else
    /// `models/SmolLM2-135M-Instruct.Q4_1.gguf` under the repository root.
    pub(crate) fn smollm2_path() -> PathBuf {
        crate::smollm::default_path()
    }

    /// The real file, parsed once per test process; `None` (after printing SKIP) if absent.
    pub(crate) fn smollm2() -> Option<&'static GgufFile> {
        static FILE: OnceLock<Option<GgufFile>> = OnceLock::new();
        let file = FILE.get_or_init(|| {
            let path = smollm2_path();
            if !path.exists() {
                return None;
            }
            Some(GgufFile::open(&path).unwrap_or_else(|e| panic!("{}: {e}", path.display())))
        });
        if file.is_none() {
            eprintln!(
                "SKIP: {} not found (run scripts/fetch-smollm2.sh)",
                smollm2_path().display()
            );
        }
        file.as_ref()
    }

    /// A deterministic xorshift64* generator.
    pub(crate) struct Rng(u64);

    impl Rng {
        pub(crate) fn new(seed: u64) -> Self {
            Rng(seed.wrapping_mul(0x9E37_79B9_7F4A_7C15) | 1)
        }
        pub(crate) fn next_u64(&mut self) -> u64 {
            self.0 ^= self.0 >> 12;
            self.0 ^= self.0 << 25;
            self.0 ^= self.0 >> 27;
            self.0.wrapping_mul(0x2545_F491_4F6C_DD1D)
        }
        pub(crate) fn below(&mut self, n: usize) -> usize {
            (self.next_u64() % n as u64) as usize
        }
        fn bytes(&mut self, n: usize) -> Vec<u8> {
            (0..n).map(|_| self.next_u64() as u8).collect()
        }
        /// A finite f16 scale in roughly [-2, 2], as little-endian bytes.
        fn f16_scale(&mut self) -> [u8; 2] {
            let x = (self.next_u64() % 4001) as f32 / 1000.0 - 2.0;
            f16::from_f32(x).to_bits().to_le_bytes()
        }
    }

    /// A tensor for [`GgufWriter`].
    pub(crate) struct WTensor {
        pub name: String,
        pub dims: Vec<u64>,
        pub type_id: u32,
        pub data: Vec<u8>,
        /// Written instead of the computed offset when set.
        pub offset_override: Option<u64>,
    }

    /// Writes synthetic GGUF files: header, metadata, tensor infos, padding, data (each
    /// tensor aligned, no padding after the last one so that the file ends with its data).
    pub(crate) struct GgufWriter {
        pub version: u32,
        pub kvs: Vec<(String, Value)>,
        pub tensors: Vec<WTensor>,
        /// Alignment used for layout (write `general.alignment` yourself to declare it).
        pub alignment: u64,
    }

    pub(crate) fn put_str(out: &mut Vec<u8>, s: &str) {
        out.extend_from_slice(&(s.len() as u64).to_le_bytes());
        out.extend_from_slice(s.as_bytes());
    }

    fn put_array(out: &mut Vec<u8>, a: &Array) {
        out.extend_from_slice(&a.element_type().id().to_le_bytes());
        out.extend_from_slice(&(a.len() as u64).to_le_bytes());
        match a {
            Array::U8(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::I8(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::U16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::I16(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::U32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::I32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::F32(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::Bool(v) => v.iter().for_each(|&x| out.push(x as u8)),
            Array::String(v) => v.iter().for_each(|x| put_str(out, x)),
            Array::Nested(v) => v.iter().for_each(|x| put_array(out, x)),
            Array::U64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::I64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
            Array::F64(v) => v
                .iter()
                .for_each(|x| out.extend_from_slice(&x.to_le_bytes())),
        }
    }

    /// A value without its type id.
    pub(crate) fn put_value(out: &mut Vec<u8>, v: &Value) {
        match v {
            Value::U8(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I8(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I16(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::U32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F32(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::Bool(x) => out.push(*x as u8),
            Value::String(s) => put_str(out, s),
            Value::Array(a) => put_array(out, a),
            Value::U64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::I64(x) => out.extend_from_slice(&x.to_le_bytes()),
            Value::F64(x) => out.extend_from_slice(&x.to_le_bytes()),
        }
    }

    impl GgufWriter {
        pub(crate) fn new() -> Self {
            GgufWriter {
                version: 3,
                kvs: Vec::new(),
                tensors: Vec::new(),
                alignment: DEFAULT_ALIGNMENT,
            }
        }

        pub(crate) fn kv(mut self, key: &str, value: Value) -> Self {
            self.kvs.push((key.to_string(), value));
            self
        }

        pub(crate) fn tensor(
            mut self,
            name: &str,
            dims: &[u64],
            ty: GgmlType,
            data: Vec<u8>,
        ) -> Self {
            self.tensors.push(WTensor {
                name: name.to_string(),
                dims: dims.to_vec(),
                type_id: ty.0,
                data,
                offset_override: None,
            });
            self
        }

        pub(crate) fn build(&self) -> Vec<u8> {
            let align = |x: u64| x.div_ceil(self.alignment) * self.alignment;
            let mut out = Vec::new();
            out.extend_from_slice(&GGUF_MAGIC);
            out.extend_from_slice(&self.version.to_le_bytes());
            out.extend_from_slice(&(self.tensors.len() as u64).to_le_bytes());
            out.extend_from_slice(&(self.kvs.len() as u64).to_le_bytes());
            for (k, v) in &self.kvs {
                put_str(&mut out, k);
                out.extend_from_slice(&v.value_type().id().to_le_bytes());
                put_value(&mut out, v);
            }
            let mut offset = 0u64;
            let mut offsets = Vec::new();
            for t in &self.tensors {
                put_str(&mut out, &t.name);
                out.extend_from_slice(&(t.dims.len() as u32).to_le_bytes());
                t.dims
                    .iter()
                    .for_each(|d| out.extend_from_slice(&d.to_le_bytes()));
                out.extend_from_slice(&t.type_id.to_le_bytes());
                out.extend_from_slice(&t.offset_override.unwrap_or(offset).to_le_bytes());
                offsets.push(offset);
                offset = align(offset + t.data.len() as u64);
            }
            let data_start = align(out.len() as u64);
            for (t, off) in self.tensors.iter().zip(offsets) {
                out.resize((data_start + off) as usize, 0);
                out.extend_from_slice(&t.data);
            }
            if self.tensors.is_empty() {
                out.resize(data_start as usize, 0);
            }
            out
        }
    }

    /// One of each value type, extremes included, and arrays of each (nested, empty).
    fn every_value() -> Vec<(String, Value)> {
        let mut kvs: Vec<(&str, Value)> = vec![
            ("t.u8", Value::U8(u8::MAX)),
            ("t.i8", Value::I8(i8::MIN)),
            ("t.u16", Value::U16(0xBEEF)),
            ("t.i16", Value::I16(-12345)),
            ("t.u32", Value::U32(0xDEAD_BEEF)),
            ("t.i32", Value::I32(i32::MIN + 7)),
            ("t.f32", Value::F32(-1.5e-7)),
            ("t.bool.true", Value::Bool(true)),
            ("t.bool.false", Value::Bool(false)),
            ("t.string", Value::String("héllo, 世界 🙂".into())),
            ("t.string.empty", Value::String(String::new())),
            ("t.u64", Value::U64(u64::MAX - 1)),
            ("t.i64", Value::I64(i64::MIN + 1)),
            ("t.f64", Value::F64(std::f64::consts::PI)),
            ("a.u8", Value::Array(Array::U8(vec![0, 1, 255]))),
            ("a.i8", Value::Array(Array::I8(vec![-128, 0, 127]))),
            ("a.u16", Value::Array(Array::U16(vec![1, 65535]))),
            ("a.i16", Value::Array(Array::I16(vec![-32768, 32767]))),
            ("a.u32", Value::Array(Array::U32(vec![7, u32::MAX]))),
            ("a.i32", Value::Array(Array::I32(vec![-1, 2, -3]))),
            (
                "a.f32",
                Value::Array(Array::F32(vec![0.25, -0.0, f32::INFINITY])),
            ),
            ("a.bool", Value::Array(Array::Bool(vec![true, false, true]))),
            (
                "a.string",
                Value::Array(Array::String(vec![
                    "a".into(),
                    String::new(),
                    "Ġthe".into(),
                ])),
            ),
            ("a.u64", Value::Array(Array::U64(vec![u64::MAX]))),
            ("a.i64", Value::Array(Array::I64(vec![i64::MIN, i64::MAX]))),
            ("a.f64", Value::Array(Array::F64(vec![1e300, -2.5]))),
            ("a.empty", Value::Array(Array::F64(vec![]))),
            (
                "a.nested",
                Value::Array(Array::Nested(vec![
                    Array::U8(vec![1, 2]),
                    Array::String(vec!["x".into()]),
                    Array::Nested(vec![Array::I64(vec![-5]), Array::Bool(vec![])]),
                    Array::U32(vec![]),
                ])),
            ),
        ];
        kvs.sort_by_key(|(k, _)| k.len()); // any order other than declaration order is fine
        kvs.into_iter().map(|(k, v)| (k.to_string(), v)).collect()
    }

    fn f32_bytes(v: &[f32]) -> Vec<u8> {
        v.iter().flat_map(|x| x.to_le_bytes()).collect()
    }

    /// A small file with metadata of several types and two tensors, the last one ending
    /// the file.
    fn small_file() -> Vec<u8> {
        let mut w = GgufWriter::new()
            .kv("general.architecture", Value::String("llama".into()))
            .kv("llama.block_count", Value::U32(2))
            .kv(
                "tokenizer.ggml.tokens",
                Value::Array(Array::String(vec!["a".into(), "bc".into()])),
            )
            .kv(
                "x.nested",
                Value::Array(Array::Nested(vec![Array::I16(vec![3, -4])])),
            )
            .kv("x.flag", Value::Bool(true))
            .tensor("norm", &[3], GgmlType::F32, f32_bytes(&[1.0, 2.0, 3.0]));
        let mut rng = Rng::new(7);
        let mut q = Vec::new();
        for _ in 0..2 {
            q.extend_from_slice(&rng.f16_scale());
            q.extend_from_slice(&rng.bytes(32));
        }
        w = w.tensor("emb", &[32, 2], GgmlType::Q8_0, q);
        w.build()
    }

    #[test]
    fn every_value_type_round_trips() {
        let kvs = every_value();
        let mut w = GgufWriter::new();
        w.kvs = kvs.clone();
        let file = GgufFile::parse(w.build()).unwrap();
        assert_eq!(file.version(), 3);
        assert_eq!(file.tensor_count(), 0);
        for (k, v) in &kvs {
            assert_eq!(file.metadata(k), Some(v), "{k}");
        }
        let order: Vec<&str> = file.metadata_entries().map(|(k, _)| k).collect();
        assert_eq!(
            order,
            kvs.iter().map(|(k, _)| k.as_str()).collect::<Vec<_>>()
        );
        assert_eq!(file.metadata("absent"), None);
        // Arrays nested exactly MAX_ARRAY_DEPTH deep are accepted.
        let mut deep = Array::U8(vec![9]);
        for _ in 1..MAX_ARRAY_DEPTH {
            deep = Array::Nested(vec![deep]);
        }
        let w = GgufWriter::new().kv("deep", Value::Array(deep.clone()));
        assert_eq!(
            GgufFile::parse(w.build()).unwrap().metadata("deep"),
            Some(&Value::Array(deep))
        );
    }

    #[test]
    fn typed_getters_and_their_errors() {
        let mut w = GgufWriter::new();
        w.kvs = every_value();
        let f = GgufFile::parse(w.build()).unwrap();
        assert_eq!(f.get_u8("t.u8").unwrap(), 255);
        assert_eq!(f.get_i8("t.i8").unwrap(), -128);
        assert_eq!(f.get_u16("t.u16").unwrap(), 0xBEEF);
        assert_eq!(f.get_i16("t.i16").unwrap(), -12345);
        assert_eq!(f.get_u32("t.u32").unwrap(), 0xDEAD_BEEF);
        assert_eq!(f.get_i32("t.i32").unwrap(), i32::MIN + 7);
        assert_eq!(f.get_u64("t.u64").unwrap(), u64::MAX - 1);
        assert_eq!(f.get_i64("t.i64").unwrap(), i64::MIN + 1);
        assert_eq!(f.get_f32("t.f32").unwrap(), -1.5e-7);
        assert_eq!(f.get_f64("t.f64").unwrap(), std::f64::consts::PI);
        assert!(f.get_bool("t.bool.true").unwrap());
        assert!(!f.get_bool("t.bool.false").unwrap());
        assert_eq!(f.get_str("t.string").unwrap(), "héllo, 世界 🙂");
        assert_eq!(f.get_str_array("a.string").unwrap(), ["a", "", "Ġthe"]);
        assert_eq!(f.get_i32_array("a.i32").unwrap(), [-1, 2, -3]);
        assert_eq!(f.get_u32_array("a.u32").unwrap(), [7, u32::MAX]);
        assert_eq!(f.get_f32_array("a.f32").unwrap()[..2], [0.25, -0.0]);
        assert_eq!(f.get_array("a.empty").unwrap(), &Array::F64(vec![]));
        assert_eq!(f.get_usize("t.u16").unwrap(), 0xBEEF);
        assert_eq!(f.get_usize("t.u32").unwrap(), 0xDEAD_BEEF);

        let err = f.get_u32("t.f32").unwrap_err();
        assert!(
            matches!(&err, GgufError::WrongType { key, expected, actual }
            if key == "t.f32" && expected == "u32" && actual == "f32"),
            "{err:?}"
        );
        assert_eq!(
            err.to_string(),
            "metadata key \"t.f32\": expected u32, found f32"
        );
        let err = f.get_str_array("a.i32").unwrap_err();
        assert_eq!(
            err.to_string(),
            "metadata key \"a.i32\": expected array of string, found array of i32"
        );
        assert!(matches!(
            f.get_str("t.u8"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            f.get_bool("t.u8"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            f.get_array("t.u8"),
            Err(GgufError::WrongType { .. })
        ));
        assert!(matches!(
            f.get_usize("t.f64"),
            Err(GgufError::WrongType { .. })
        ));
        let err = f.get_usize("t.i8").unwrap_err();
        assert!(
            matches!(&err, GgufError::OutOfRange { value, .. } if value == "-128"),
            "{err:?}"
        );
        let err = f.get_u32("no.such.key").unwrap_err();
        assert!(matches!(&err, GgufError::MissingKey(k) if k == "no.such.key"));
        assert_eq!(err.to_string(), "metadata key \"no.such.key\" not found");
    }

    #[test]
    fn versions_and_magic() {
        for version in [2, 3] {
            let mut w = GgufWriter::new().kv("k", Value::U8(1));
            w.version = version;
            assert_eq!(GgufFile::parse(w.build()).unwrap().version(), version);
        }
        for version in [0, 1, 4, 0xFFFF_FFFF] {
            let mut w = GgufWriter::new();
            w.version = version;
            let err = GgufFile::parse(w.build()).unwrap_err();
            assert!(
                matches!(err, GgufError::UnsupportedVersion(v) if v == version),
                "{err:?}"
            );
        }
        let mut w = GgufWriter::new();
        w.version = 3u32.swap_bytes();
        let err = GgufFile::parse(w.build()).unwrap_err();
        assert!(matches!(err, GgufError::BigEndian(3)), "{err:?}");

        let mut bytes = small_file();
        bytes[..4].copy_from_slice(b"GGML");
        let err = GgufFile::parse(bytes).unwrap_err();
        assert!(matches!(err, GgufError::BadMagic { found } if &found == b"GGML"));
        assert!(err.to_string().starts_with("not a GGUF file"), "{err}");
        let err = GgufFile::parse(b"\x89PNG\r\n\x1a\n0000000000000000".to_vec()).unwrap_err();
        assert!(matches!(err, GgufError::BadMagic { .. }));
        assert!(matches!(
            GgufFile::parse(Vec::new()),
            Err(GgufError::Truncated { offset: 0, .. })
        ));

        let err = GgufFile::open("/nonexistent/dir/x.gguf").unwrap_err();
        assert!(matches!(err, GgufError::Io { .. }));
        assert!(err.to_string().contains("/nonexistent/dir/x.gguf"), "{err}");
    }

    /// Decodes an IEEE half from its fields, independently of the `half` crate.
    fn f16_reference(bits: u16) -> f32 {
        let sign = if bits & 0x8000 != 0 { -1.0f64 } else { 1.0 };
        let exp = i32::from((bits >> 10) & 0x1f);
        let mant = f64::from(bits & 0x3ff);
        let mag = match exp {
            0 => mant * 2f64.powi(-24),
            31 if mant == 0.0 => f64::INFINITY,
            31 => f64::NAN,
            e => (1.0 + mant / 1024.0) * 2f64.powi(e - 15),
        };
        (sign * mag) as f32
    }

    fn same(a: f32, b: f32) -> bool {
        a.to_bits() == b.to_bits() || (a.is_nan() && b.is_nan())
    }

    #[test]
    fn dequantizes_float_types() {
        let f16_bits: Vec<u16> = vec![
            0x3C00, 0xC000, 0x7BFF, 0x0001, 0x8000, 0x7C00, 0x3555, 0x0400,
        ];
        let expect = [
            1.0,
            -2.0,
            65504.0,
            5.960_464_5e-8,
            -0.0,
            f32::INFINITY,
            0.333_251_95,
            6.103_515_6e-5,
        ];
        let bf16_bits: Vec<u16> = vec![0x3F80, 0x4049, 0xC2F7, 0x0000];
        let bf_expect = [1.0, 3.140625, -123.5, 0.0];
        let mut rng = Rng::new(1);
        let random_f16: Vec<u16> = (0..64).map(|_| rng.next_u64() as u16).collect();
        let random_f32: Vec<f32> = (0..10)
            .map(|_| f32::from_bits(rng.next_u64() as u32))
            .collect();
        let le16 = |v: &[u16]| v.iter().flat_map(|x| x.to_le_bytes()).collect::<Vec<u8>>();
        let f = GgufFile::parse(
            GgufWriter::new()
                .tensor("h", &[8], GgmlType::F16, le16(&f16_bits))
                .tensor("bf", &[2, 2], GgmlType::BF16, le16(&bf16_bits))
                .tensor("hr", &[16, 2, 2], GgmlType::F16, le16(&random_f16))
                .tensor("f", &[5, 2], GgmlType::F32, f32_bytes(&random_f32))
                .build(),
        )
        .unwrap();
        let (h, dims) = f.tensor_f32("h").unwrap();
        assert_eq!(dims, [8]);
        assert_eq!(h, expect);
        for (&b, &x) in f16_bits.iter().zip(&h) {
            assert!(same(f16_reference(b), x), "{b:#06x}");
        }
        let (bf, dims) = f.tensor_f32("bf").unwrap();
        assert_eq!((bf, dims), (bf_expect.to_vec(), vec![2, 2]));
        let (hr, dims) = f.tensor_f32("hr").unwrap();
        assert_eq!(dims, [16, 2, 2]);
        for (&b, &x) in random_f16.iter().zip(&hr) {
            assert!(
                same(f16_reference(b), x),
                "{b:#06x}: {x} vs {}",
                f16_reference(b)
            );
        }
        let (fv, dims) = f.tensor_f32("f").unwrap();
        assert_eq!(dims, [5, 2]);
        assert!(fv.iter().zip(&random_f32).all(|(a, b)| same(*a, *b)));
    }

    /// Element `i` of a quantized tensor by the formula, one element at a time.
    fn quant_reference(ty: GgmlType, data: &[u8], i: usize) -> f32 {
        let (block, j) = (i / 32, i % 32);
        let nibble = |qs: &[u8]| {
            if j < 16 {
                qs[j] & 0x0f
            } else {
                qs[j - 16] >> 4
            }
        };
        match ty {
            GgmlType::Q8_0 => {
                let b = &data[block * 34..][..34];
                f16_reference(u16::from_le_bytes([b[0], b[1]])) * f32::from(b[2 + j] as i8)
            }
            GgmlType::Q4_0 => {
                let b = &data[block * 18..][..18];
                f16_reference(u16::from_le_bytes([b[0], b[1]])) * (f32::from(nibble(&b[2..])) - 8.0)
            }
            GgmlType::Q4_1 => {
                let b = &data[block * 20..][..20];
                let d = f16_reference(u16::from_le_bytes([b[0], b[1]]));
                let m = f16_reference(u16::from_le_bytes([b[2], b[3]]));
                d * f32::from(nibble(&b[4..])) + m
            }
            _ => unreachable!(),
        }
    }

    #[test]
    fn dequantizes_q8_0_q4_0_q4_1_blocks() {
        let mut rng = Rng::new(42);
        for (ty, block_bytes, scales) in [
            (GgmlType::Q8_0, 34, 1),
            (GgmlType::Q4_0, 18, 1),
            (GgmlType::Q4_1, 20, 2),
        ] {
            let dims = [96u64, 5, 2]; // 3 blocks per row, 10 rows
            let n_blocks = 30;
            let mut data = Vec::new();
            for _ in 0..n_blocks {
                for _ in 0..scales {
                    data.extend_from_slice(&rng.f16_scale());
                }
                data.extend(rng.bytes(block_bytes - 2 * scales));
            }
            let f = GgufFile::parse(
                GgufWriter::new()
                    .tensor("q", &dims, ty, data.clone())
                    .build(),
            )
            .unwrap();
            let info = f.tensor_info("q").unwrap();
            assert_eq!(
                (info.n_elements, info.n_bytes, info.ggml_type),
                (960, n_blocks * block_bytes, ty)
            );
            assert_eq!(f.tensor_bytes("q").unwrap(), &data[..]);
            let (x, got_dims) = f.tensor_f32("q").unwrap();
            assert_eq!(got_dims, [96, 5, 2]);
            assert_eq!(x.len(), 960);
            for (i, &v) in x.iter().enumerate() {
                let r = quant_reference(ty, &data, i);
                assert!(same(v, r), "{ty} element {i}: {v} vs {r}");
            }
        }
        // Hand-checked block: Q4_1 with d = 0.5, m = -1, byte 0x21 at position 0.
        let mut b = Vec::new();
        b.extend_from_slice(&f16::from_f32(0.5).to_bits().to_le_bytes());
        b.extend_from_slice(&f16::from_f32(-1.0).to_bits().to_le_bytes());
        b.push(0x21);
        b.extend_from_slice(&[0xF0; 15]);
        let f = GgufFile::parse(
            GgufWriter::new()
                .tensor("q", &[32], GgmlType::Q4_1, b)
                .build(),
        )
        .unwrap();
        let (x, _) = f.tensor_f32("q").unwrap();
        assert_eq!((x[0], x[1], x[16], x[17]), (-0.5, -1.0, 0.0, 6.5));
    }

    #[test]
    fn alignment_default_custom_and_invalid() {
        let data = |n: usize| f32_bytes(&(0..n).map(|i| i as f32).collect::<Vec<_>>());
        // Default 32: a 3-element tensor (12 bytes) pushes the next to offset 32.
        let f = GgufFile::parse(
            GgufWriter::new()
                .tensor("a", &[3], GgmlType::F32, data(3))
                .tensor("b", &[5], GgmlType::F32, data(5))
                .build(),
        )
        .unwrap();
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.data_offset() % 32, 0);
        assert_eq!(f.tensor_info("b").unwrap().offset, 32);
        assert_eq!(f.tensor_f32("b").unwrap().0, [0.0, 1.0, 2.0, 3.0, 4.0]);
        for alignment in [1u32, 8, 64, 256] {
            let mut w = GgufWriter::new()
                .kv(ALIGNMENT_KEY, Value::U32(alignment))
                .tensor("a", &[3], GgmlType::F32, data(3))
                .tensor("b", &[5], GgmlType::F32, data(5));
            w.alignment = u64::from(alignment);
            let f = GgufFile::parse(w.build()).unwrap();
            assert_eq!(f.alignment(), u64::from(alignment));
            assert_eq!(f.data_offset() % alignment as usize, 0);
            assert_eq!(
                f.tensor_info("b").unwrap().offset,
                12u64.div_ceil(alignment.into()) * u64::from(alignment)
            );
            assert_eq!(f.tensor_f32("a").unwrap().0, [0.0, 1.0, 2.0]);
            assert_eq!(f.tensor_f32("b").unwrap().0, [0.0, 1.0, 2.0, 3.0, 4.0]);
        }
        for bad in [0u32, 3, 48] {
            let w = GgufWriter::new().kv(ALIGNMENT_KEY, Value::U32(bad));
            assert!(
                matches!(GgufFile::parse(w.build()), Err(GgufError::BadAlignment(a)) if a == u64::from(bad))
            );
        }
        let w = GgufWriter::new().kv(ALIGNMENT_KEY, Value::U64(32));
        assert!(matches!(
            GgufFile::parse(w.build()),
            Err(GgufError::WrongType { .. })
        ));
        // A tensor offset that is not a multiple of the alignment.
        let mut w = GgufWriter::new().tensor("a", &[4], GgmlType::F32, data(4));
        w.tensors[0].offset_override = Some(4);
        let err = GgufFile::parse(w.build()).unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::MisalignedTensor {
                    offset: 4,
                    alignment: 32,
                    ..
                }
            ),
            "{err:?}"
        );
    }

    #[test]
    fn truncation_at_every_offset_is_an_error() {
        let full = small_file();
        let f = GgufFile::parse(full.clone()).unwrap();
        assert_eq!(f.tensor_count(), 2);
        assert_eq!(f.tensor_names().collect::<Vec<_>>(), ["norm", "emb"]);
        for len in 0..full.len() {
            match GgufFile::parse(full[..len].to_vec()) {
                Err(GgufError::Truncated {
                    offset,
                    needed,
                    available,
                    ..
                }) => {
                    assert!(
                        offset <= len && (available as u64) < needed && offset + available == len,
                        "{len}"
                    );
                }
                Err(GgufError::DataOutOfRange { end, file_len, .. }) => {
                    assert!(end > file_len as u128 && file_len == len)
                }
                // A cut inside a counted region can make the count itself the first thing found wrong.
                Err(GgufError::CountTooLarge { remaining, .. }) => assert!(remaining < len),
                Err(other) => panic!("length {len}: unexpected {other:?}"),
                Ok(_) => panic!("length {len} of {} parsed", full.len()),
            }
        }
        let err = GgufFile::parse(full[..10].to_vec()).unwrap_err();
        assert_eq!(
            err.to_string(),
            "truncated GGUF file: reading tensor count needs 8 bytes at offset 8, but only 2 remain"
        );
    }

    /// Header + raw metadata bytes (one entry) for hand-made corruptions.
    fn with_raw_kv(tensor_count: u64, kv_count: u64, kv: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        out.extend_from_slice(&GGUF_MAGIC);
        out.extend_from_slice(&3u32.to_le_bytes());
        out.extend_from_slice(&tensor_count.to_le_bytes());
        out.extend_from_slice(&kv_count.to_le_bytes());
        out.extend_from_slice(kv);
        out.resize(out.len() + 64, 0); // some slack so that counts, not lengths, are the issue
        out
    }

    fn raw_kv(key: &str, type_id: u32, value: &[u8]) -> Vec<u8> {
        let mut out = Vec::new();
        put_str(&mut out, key);
        out.extend_from_slice(&type_id.to_le_bytes());
        out.extend_from_slice(value);
        out
    }

    #[test]
    fn corrupt_counts_are_rejected_before_allocating() {
        let err = GgufFile::parse(with_raw_kv(u64::MAX, 0, &[])).unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::CountTooLarge {
                    count: u64::MAX,
                    ..
                }
            ),
            "{err:?}"
        );
        assert!(err.to_string().contains("tensor count"), "{err}");
        let err = GgufFile::parse(with_raw_kv(0, u64::MAX / 2, &[])).unwrap_err();
        assert!(matches!(&err, GgufError::CountTooLarge { .. }), "{err:?}");
        assert!(err.to_string().contains("metadata entry count"), "{err}");
        // 1 << 61 entries of 8 bytes overflow u64 when multiplied.
        let mut arr = 8u32.to_le_bytes().to_vec();
        arr.extend_from_slice(&(1u64 << 61).to_le_bytes());
        let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 9, &arr))).unwrap_err();
        assert!(
            matches!(&err, GgufError::CountTooLarge { count, min_item_bytes: 8, .. } if *count == 1 << 61),
            "{err:?}"
        );
        assert!(
            err.to_string()
                .contains("element count of value of metadata key \"k\""),
            "{err}"
        );
        for elem in 0..=12u32 {
            let mut arr = elem.to_le_bytes().to_vec();
            arr.extend_from_slice(&1_000_000u64.to_le_bytes());
            let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 9, &arr))).unwrap_err();
            assert!(
                matches!(&err, GgufError::CountTooLarge { .. }),
                "element type {elem}: {err:?}"
            );
        }
        // A string length larger than the file.
        let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 8, &u64::MAX.to_le_bytes())))
            .unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::Truncated {
                    needed: u64::MAX,
                    ..
                }
            ),
            "{err:?}"
        );
        let mut key = (1u64 << 40).to_le_bytes().to_vec();
        key.extend_from_slice(b"abc");
        let err = GgufFile::parse(with_raw_kv(0, 1, &key)).unwrap_err();
        assert!(
            matches!(&err, GgufError::Truncated { what, .. } if what == "key of metadata entry #0"),
            "{err:?}"
        );
    }

    #[test]
    fn corrupt_values_are_rejected() {
        let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 13, &[0; 8]))).unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::BadValueType {
                    type_id: 13,
                    offset: 33,
                    ..
                }
            ),
            "{err:?}"
        );
        let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 7, &[2]))).unwrap_err();
        assert!(
            matches!(&err, GgufError::BadBool { byte: 2, .. }),
            "{err:?}"
        );
        let mut s = 2u64.to_le_bytes().to_vec();
        s.extend_from_slice(&[0xC3, 0x28]);
        let err = GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 8, &s))).unwrap_err();
        assert!(
            matches!(&err, GgufError::BadUtf8 { offset: 45, .. }),
            "{err:?}"
        );
        // MAX_ARRAY_DEPTH arrays around an empty u8 array: one level too deep; one fewer is fine.
        let nested = |levels: usize| {
            let mut v = Vec::new();
            for _ in 0..levels {
                v.extend_from_slice(&9u32.to_le_bytes());
                v.extend_from_slice(&1u64.to_le_bytes());
            }
            v.extend_from_slice(&0u32.to_le_bytes());
            v.extend_from_slice(&0u64.to_le_bytes());
            GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 9, &v)))
        };
        let err = nested(MAX_ARRAY_DEPTH).unwrap_err();
        assert!(matches!(&err, GgufError::NestingTooDeep { .. }), "{err:?}");
        let f = nested(MAX_ARRAY_DEPTH - 1).unwrap();
        let mut depth = 1;
        let mut a = f.get_array("k").unwrap();
        while let Array::Nested(inner) = a {
            a = &inner[0];
            depth += 1;
        }
        assert_eq!((depth, a), (MAX_ARRAY_DEPTH, &Array::U8(vec![])));
        // Deep nesting declared all the way to the end of a large buffer must not overflow the stack.
        let mut huge = Vec::new();
        for _ in 0..100_000 {
            huge.extend_from_slice(&9u32.to_le_bytes());
            huge.extend_from_slice(&1u64.to_le_bytes());
        }
        assert!(matches!(
            GgufFile::parse(with_raw_kv(0, 1, &raw_kv("k", 9, &huge))),
            Err(GgufError::NestingTooDeep { .. })
        ));
        let w = GgufWriter::new()
            .kv("k", Value::U8(1))
            .kv("k", Value::U8(2));
        assert!(matches!(GgufFile::parse(w.build()), Err(GgufError::DuplicateKey(k)) if k == "k"));
    }

    #[test]
    fn corrupt_tensor_infos_are_rejected() {
        let one = |dims: &[u64], type_id: u32, data: Vec<u8>| {
            let mut w = GgufWriter::new().tensor("t", dims, GgmlType::F32, data);
            w.tensors[0].type_id = type_id;
            GgufFile::parse(w.build())
        };
        let err = one(&[1, 1, 1, 1, 1], 0, vec![0; 4]).unwrap_err();
        assert!(
            matches!(&err, GgufError::TooManyDims { n_dims: 5, .. }),
            "{err:?}"
        );
        let err = one(&[1 << 40, 1 << 40], 0, vec![0; 4]).unwrap_err();
        assert!(matches!(&err, GgufError::DimsOverflow { .. }), "{err:?}");
        assert!(err.to_string().contains("overflows"), "{err}");
        // Element count fits, byte size does not.
        let err = one(&[1 << 62, 2], 0, vec![0; 4]).unwrap_err();
        assert!(matches!(&err, GgufError::DimsOverflow { .. }), "{err:?}");
        let err = one(&[1 << 32, 1 << 20], 0, vec![0; 4]).unwrap_err();
        assert!(matches!(&err, GgufError::DataOutOfRange { .. }), "{err:?}");
        let err = one(&[4], 99, vec![0; 16]).unwrap_err();
        assert!(
            matches!(&err, GgufError::UnknownGgmlType { type_id: 99, .. }),
            "{err:?}"
        );
        let err = one(&[32], 9, vec![0; 36]).unwrap_err(); // Q8_1: deliberately not in the table
        assert!(
            matches!(&err, GgufError::UnknownGgmlType { type_id: 9, .. }),
            "{err:?}"
        );
        let err = one(&[16], GgmlType::Q4_0.0, vec![0; 18]).unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::PartialBlock {
                    row_len: 16,
                    block_len: 32,
                    ..
                }
            ),
            "{err:?}"
        );
        // n_dims = u32::MAX, written by hand.
        let mut info = Vec::new();
        put_str(&mut info, "t");
        info.extend_from_slice(&u32::MAX.to_le_bytes());
        let err = GgufFile::parse(with_raw_kv(1, 0, &info)).unwrap_err();
        assert!(
            matches!(
                &err,
                GgufError::TooManyDims {
                    n_dims: u32::MAX,
                    ..
                }
            ),
            "{err:?}"
        );
        // Offsets beyond the file, including one that overflows u64 when the data offset is added.
        for offset in [32, 1 << 20, u64::MAX - 31] {
            let mut w = GgufWriter::new().tensor("t", &[4], GgmlType::F32, vec![0; 16]);
            w.tensors[0].offset_override = Some(offset);
            let err = GgufFile::parse(w.build()).unwrap_err();
            assert!(
                matches!(&err, GgufError::DataOutOfRange { start, .. } if *start > u128::from(offset)),
                "{err:?}"
            );
            assert!(err.to_string().contains("out of range"), "{err}");
        }
        let w = GgufWriter::new()
            .tensor("t", &[1], GgmlType::F32, vec![0; 4])
            .tensor("t", &[1], GgmlType::F32, vec![0; 4]);
        assert!(
            matches!(GgufFile::parse(w.build()), Err(GgufError::DuplicateTensor(n)) if n == "t")
        );
        // Zero dims (a scalar) and a zero-sized dim are well-formed.
        let f = GgufFile::parse(
            GgufWriter::new()
                .tensor("s", &[], GgmlType::F32, f32_bytes(&[2.5]))
                .tensor("e", &[0, 3], GgmlType::Q4_1, vec![])
                .build(),
        )
        .unwrap();
        assert_eq!(f.tensor_f32("s").unwrap(), (vec![2.5], vec![]));
        assert_eq!(f.tensor_f32("e").unwrap(), (vec![], vec![0, 3]));
    }

    #[test]
    fn unknown_tensor_and_unsupported_type() {
        let f = GgufFile::parse(
            GgufWriter::new()
                .tensor("k", &[256, 2], GgmlType::Q4_K, vec![7; 288])
                .build(),
        )
        .unwrap();
        let err = f.tensor_f32("k").unwrap_err();
        assert!(
            matches!(&err, GgufError::UnsupportedType { ty, .. } if *ty == GgmlType::Q4_K),
            "{err:?}"
        );
        assert!(
            err.to_string().contains("unsupported ggml type Q4_K"),
            "{err}"
        );
        assert_eq!(f.tensor_bytes("k").unwrap(), &[7; 288][..]);
        assert_eq!(f.tensor_info("k").unwrap().dims, [256, 2]);
        for res in [
            f.tensor_info("nope").map(|_| ()),
            f.tensor_f32("nope").map(|_| ()),
            f.tensor_bytes("nope").map(|_| ()),
        ] {
            assert!(matches!(res, Err(GgufError::UnknownTensor(ref n)) if n == "nope"));
        }
        assert_eq!(GgmlType(5).to_string(), "ggml type 5");
    }

    #[test]
    fn random_corruption_never_panics() {
        let base = small_file();
        let mut rng = Rng::new(2024);
        let mut parsed = 0;
        for _ in 0..4000 {
            let mut bytes = base.clone();
            for _ in 0..1 + rng.below(4) {
                let at = rng.below(bytes.len());
                bytes[at] = match rng.below(4) {
                    0 => 0xFF,
                    1 => 0,
                    _ => rng.next_u64() as u8,
                };
            }
            if rng.below(4) == 0 {
                bytes.truncate(rng.below(bytes.len() + 1));
            }
            if let Ok(f) = GgufFile::parse(bytes) {
                parsed += 1;
                let names: Vec<String> = f.tensor_names().map(str::to_string).collect();
                for name in names {
                    let info = f.tensor_info(&name).unwrap().clone();
                    if let Ok((x, dims)) = f.tensor_f32(&name) {
                        assert_eq!(x.len(), info.n_elements);
                        assert_eq!(dims, info.dims);
                    }
                }
                let _ = f.get_str_array("tokenizer.ggml.tokens");
                let _ = f.get_usize("llama.block_count");
            }
        }
        // Most mutations hit tensor data or string bytes and still parse.
        assert!(parsed > 100, "{parsed}");
    }

    /// Values from testdata/gguf_reference.py (gguf-py's dequantization).
    struct Reference {
        name: &'static str,
        ggml_type: GgmlType,
        dims: &'static [usize],
        sum: f64,
        sum_sq: f64,
        first: [f32; 4],
        last: [f32; 4],
    }

    #[rustfmt::skip]
    const REFERENCES: &[Reference] = &[
        Reference {
            name: "token_embd.weight",
            ggml_type: GgmlType::Q8_0,
            dims: &[576, 49152],
            sum: -15353.04449415207,
            sum_sq: 520415.71544763993,
            first: [-0.106544495, 0.032978058, 0.0481987, -0.022830963],
            last: [0.07819176, 0.128582, -0.11989403, -0.04170227],
        },
        Reference {
            name: "blk.0.attn_q.weight",
            ggml_type: GgmlType::Q4_1,
            dims: &[576, 576],
            sum: 59.22322082519531,
            sum_sq: 26749.573275085306,
            first: [-0.09631348, 0.15734863, -0.09631348, -0.73046875],
            last: [0.009185791, -0.096832275, -0.14984131, -0.25585938],
        },
        Reference {
            name: "blk.0.ffn_down.weight",
            ggml_type: GgmlType::Q4_1,
            dims: &[1536, 576],
            sum: 150.63577270507812,
            sum_sq: 33220.11995097203,
            first: [-0.33081055, 0.34606934, 0.07531738, -0.46618652],
            last: [-0.09013367, -0.2421875, -0.09013367, -0.18136597],
        },
        Reference {
            name: "blk.29.attn_v.weight",
            ggml_type: GgmlType::Q4_1,
            dims: &[576, 192],
            sum: -23.565185546875,
            sum_sq: 9188.002153100446,
            first: [0.14172363, -0.2775879, 0.30944824, 0.22558594],
            last: [-0.20697021, -0.20697021, 0.31341553, 0.053222656],
        },
        Reference {
            name: "blk.0.attn_norm.weight",
            ggml_type: GgmlType::F32,
            dims: &[576],
            sum: 0.6129436492919922,
            sum_sq: 0.9180835409024439,
            first: [0.013977051, 0.023803711, -0.01977539, -0.030273438],
            last: [0.004547119, 0.022827148, 0.050048828, -0.038330078],
        },
        Reference {
            name: "output_norm.weight",
            ggml_type: GgmlType::F32,
            dims: &[576],
            sum: 1038.33203125,
            sum_sq: 1921.7355499267578,
            first: [1.7578125, 1.8203125, 1.78125, 1.6015625],
            last: [1.9140625, 1.8828125, 1.921875, 1.984375],
        },
    ];

    #[test]
    fn real_smollm2_file() {
        let Some(f) = smollm2() else { return };
        assert_eq!(f.version(), 3);
        assert_eq!(f.alignment(), 32);
        assert_eq!(f.data_offset(), 1_785_664); // gguf-py's GGUFReader.data_offset
        assert_eq!(f.get_str("general.architecture").unwrap(), "llama");
        assert_eq!(f.get_u32("llama.block_count").unwrap(), 30);
        assert_eq!(f.get_u32("llama.context_length").unwrap(), 8192);
        assert_eq!(f.get_u32("llama.embedding_length").unwrap(), 576);
        assert_eq!(f.get_u32("llama.feed_forward_length").unwrap(), 1536);
        assert_eq!(f.get_u32("llama.attention.head_count").unwrap(), 9);
        assert_eq!(f.get_u32("llama.attention.head_count_kv").unwrap(), 3);
        assert_eq!(f.get_u32("llama.rope.dimension_count").unwrap(), 64);
        assert_eq!(f.get_u32("llama.vocab_size").unwrap(), 49152);
        assert_eq!(f.get_f32("llama.rope.freq_base").unwrap(), 100000.0);
        assert_eq!(
            f.get_f32("llama.attention.layer_norm_rms_epsilon").unwrap(),
            1e-5
        );
        assert_eq!(f.get_usize("llama.embedding_length").unwrap(), 576);
        assert_eq!(f.get_str("tokenizer.ggml.model").unwrap(), "gpt2");
        assert_eq!(f.get_str("tokenizer.ggml.pre").unwrap(), "smollm");
        let tokens = f.get_str_array("tokenizer.ggml.tokens").unwrap();
        assert_eq!(tokens.len(), 49152);
        assert_eq!(
            &tokens[..3],
            ["<|endoftext|>", "<|im_start|>", "<|im_end|>"]
        );
        let types = f.get_i32_array("tokenizer.ggml.token_type").unwrap();
        assert_eq!(types.len(), 49152);
        assert_eq!(types.iter().filter(|&&t| t == 3).count(), 17);
        let merges = f.get_str_array("tokenizer.ggml.merges").unwrap();
        assert_eq!((merges.len(), merges[0].as_str()), (48900, "Ġ t"));
        assert_eq!(f.get_u32("tokenizer.ggml.bos_token_id").unwrap(), 1);
        assert_eq!(f.get_u32("tokenizer.ggml.eos_token_id").unwrap(), 2);
        assert_eq!(f.get_u32("tokenizer.ggml.unknown_token_id").unwrap(), 0);
        assert_eq!(f.get_u32("tokenizer.ggml.padding_token_id").unwrap(), 2);
        assert!(!f.get_bool("tokenizer.ggml.add_bos_token").unwrap());
        assert!(f
            .get_str("tokenizer.chat_template")
            .unwrap()
            .contains("<|im_start|>assistant\n"));

        assert_eq!(f.tensor_count(), 272);
        let count = |ty: GgmlType| {
            f.tensor_infos()
                .iter()
                .filter(|t| t.ggml_type == ty)
                .count()
        };
        assert_eq!(
            (
                count(GgmlType::Q8_0),
                count(GgmlType::F32),
                count(GgmlType::Q4_1)
            ),
            (1, 61, 210)
        );
        let q = f.tensor_info("blk.0.attn_q.weight").unwrap();
        assert_eq!(
            (q.dims.as_slice(), q.n_bytes),
            (&[576, 576][..], 576 * 576 / 32 * 20)
        );

        for r in REFERENCES {
            let (x, dims) = f.tensor_f32(r.name).unwrap();
            assert_eq!(
                f.tensor_info(r.name).unwrap().ggml_type,
                r.ggml_type,
                "{}",
                r.name
            );
            assert_eq!(dims, r.dims, "{}", r.name);
            assert_eq!(x.len(), dims.iter().product::<usize>());
            let sum: f64 = x.iter().map(|&v| f64::from(v)).sum();
            let sum_sq: f64 = x.iter().map(|&v| f64::from(v) * f64::from(v)).sum();
            // Summation order differs from numpy's pairwise sum; bound by |x|_1 <= sqrt(n)*|x|_2.
            let tol = 1e-9 * (x.len() as f64 * r.sum_sq).sqrt();
            assert!(
                (sum - r.sum).abs() <= tol,
                "{}: sum {sum} vs {}",
                r.name,
                r.sum
            );
            assert!(
                (sum_sq - r.sum_sq).abs() <= 1e-9 * r.sum_sq,
                "{}: sum_sq {sum_sq} vs {}",
                r.name,
                r.sum_sq
            );
            assert_eq!(x[..4], r.first, "{}", r.name);
            assert_eq!(x[x.len() - 4..], r.last, "{}", r.name);
        }
    }
}
