//! NumPy `.npz` archives (what `numpy.savez[_compressed]` writes): a zip file whose members
//! are `.npy` arrays. The archive is read by `zip` (stored and deflate members, CRC-checked).
//!
//! `.npy` (format 1.0 / 2.0 / 3.0): magic `\x93NUMPY`, version, header length, a Python-dict
//! header with `descr`, `fortran_order` and `shape`; little-endian `<f2`, `<f4`, `<f8` and
//! `<U<n>` (UTF-32 strings) are read, C order only. Why this header parse is our own: `npyz`
//! reads `.npy` too, but its Python-literal parser brings `pest` and, through its stack
//! guard, an assembly build (`psm`): about a CPU-minute of compiling for 39 one-line headers.
//!
//! A truncated or corrupted file gives an [`NpzError`], never a panic: every length is checked
//! against the member's bytes before it is used, so a damaged shape cannot ask for an
//! oversized allocation.

use std::collections::BTreeMap;
use std::io::{Cursor, Read};

/// What went wrong reading an archive, and where.
#[derive(Debug, thiserror::Error)]
pub enum NpzError {
    /// The zip structure is damaged or not a zip.
    #[error("not a valid .npz (zip) file: {0}")]
    Zip(String),
    /// A member is not a valid `.npy` array.
    #[error("member {member}: {message}")]
    Npy {
        /// The member's name.
        member: String,
        /// What is wrong with it.
        message: String,
    },
    /// A member the caller asked for is absent.
    #[error("no array named '{0}' in the archive")]
    Missing(String),
}

/// One array: its shape and its elements (converted to f32, or a string for `<U` arrays).
#[derive(Clone, Debug, PartialEq)]
pub enum NpyArray {
    /// A float array (f16 / f32 / f64 widened or narrowed to f32) with its shape.
    F32 {
        /// Shape, C order.
        shape: Vec<usize>,
        /// Elements.
        data: Vec<f32>,
    },
    /// A 0-d unicode string array.
    Str(String),
}

/// The arrays of an `.npz`, by member name without the `.npy` suffix.
#[derive(Clone, Debug, Default)]
pub struct Npz {
    arrays: BTreeMap<String, NpyArray>,
}

fn zip_err(e: impl std::fmt::Display) -> NpzError {
    NpzError::Zip(e.to_string())
}

impl Npz {
    /// Parses an archive held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, NpzError> {
        let mut archive = zip::ZipArchive::new(Cursor::new(bytes)).map_err(zip_err)?;
        let mut arrays = BTreeMap::new();
        for i in 0..archive.len() {
            let mut member = archive.by_index(i).map_err(zip_err)?;
            let name = member.name().to_string();
            // The directory's size bounds the allocation; reading to the end checks the CRC.
            let declared = usize::try_from(member.size()).unwrap_or(usize::MAX);
            if declared > bytes.len().saturating_mul(1032) {
                // Deflate expands at most 1032:1.
                return Err(zip_err(format!(
                    "{name}: declared size {declared} is impossible for a {}-byte archive",
                    bytes.len()
                )));
            }
            let mut raw = Vec::with_capacity(declared);
            member
                .read_to_end(&mut raw)
                .map_err(|e| zip_err(format!("{name}: {e}")))?;
            let key = name.strip_suffix(".npy").unwrap_or(&name).to_string();
            let array = parse_npy(&raw).map_err(|message| NpzError::Npy {
                member: name.clone(),
                message,
            })?;
            arrays.insert(key, array);
        }
        Ok(Npz { arrays })
    }

    /// Member names (without `.npy`).
    pub fn names(&self) -> impl Iterator<Item = &str> {
        self.arrays.keys().map(|s| s.as_str())
    }

    /// A float array by name, with its shape checked against `shape`.
    pub fn f32(&self, name: &str, shape: &[usize]) -> Result<&[f32], NpzError> {
        match self.arrays.get(name) {
            Some(NpyArray::F32 { shape: s, data }) if s == shape => Ok(data),
            Some(NpyArray::F32 { shape: s, .. }) => Err(NpzError::Npy {
                member: name.into(),
                message: format!("shape {s:?}, expected {shape:?}"),
            }),
            Some(NpyArray::Str(_)) => Err(NpzError::Npy {
                member: name.into(),
                message: "a string, expected a float array".into(),
            }),
            None => Err(NpzError::Missing(name.into())),
        }
    }

    /// A string array by name.
    pub fn string(&self, name: &str) -> Result<&str, NpzError> {
        match self.arrays.get(name) {
            Some(NpyArray::Str(s)) => Ok(s),
            Some(_) => Err(NpzError::Npy {
                member: name.into(),
                message: "a float array, expected a string".into(),
            }),
            None => Err(NpzError::Missing(name.into())),
        }
    }
}

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

/// Parses one `.npy` image.
fn parse_npy(b: &[u8]) -> Result<NpyArray, String> {
    if b.get(..6) != Some(b"\x93NUMPY") {
        return Err("not an .npy array (bad magic)".into());
    }
    let major = *b.get(6).ok_or("truncated header")?;
    let (hlen, hstart) = match major {
        1 => (u16_at(b, 8).ok_or("truncated header")? as usize, 10),
        2 | 3 => (u32_at(b, 8).ok_or("truncated header")? as usize, 12),
        v => return Err(format!("unsupported .npy version {v}")),
    };
    let header = b
        .get(hstart..hstart + hlen)
        .ok_or("header runs past the end")?;
    let header = std::str::from_utf8(header).map_err(|_| "header is not text")?;
    let field = |key: &str| -> Result<&str, String> {
        let k = format!("'{key}':");
        let at = header.find(&k).ok_or(format!("header has no '{key}'"))? + k.len();
        Ok(header[at..].trim_start())
    };
    let descr = field("descr")?;
    let descr = descr
        .strip_prefix('\'')
        .and_then(|s| s.split('\'').next())
        .ok_or("bad descr")?;
    if field("fortran_order")?.starts_with("True") {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape_text = field("shape")?;
    let shape_text = shape_text
        .strip_prefix('(')
        .and_then(|s| s.split(')').next())
        .ok_or("bad shape")?;
    let shape = shape_text
        .split(',')
        .map(str::trim)
        .filter(|s| !s.is_empty())
        .map(|s| {
            s.parse::<usize>()
                .map_err(|_| format!("bad dimension '{s}'"))
        })
        .collect::<Result<Vec<_>, _>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let data = &b[hstart + hlen..];
    let need = |size: usize| -> Result<&[u8], String> {
        let bytes = count.checked_mul(size).ok_or("size overflows")?;
        data.get(..bytes).ok_or(format!(
            "{count} elements of {size} bytes, {} bytes present",
            data.len()
        ))
    };
    match descr {
        "<f2" => Ok(NpyArray::F32 {
            data: need(2)?
                .chunks_exact(2)
                .map(|c| half::f16::from_le_bytes([c[0], c[1]]).to_f32())
                .collect(),
            shape,
        }),
        "<f4" => Ok(NpyArray::F32 {
            data: need(4)?
                .chunks_exact(4)
                .map(|c| f32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .collect(),
            shape,
        }),
        "<f8" => Ok(NpyArray::F32 {
            data: need(8)?
                .chunks_exact(8)
                .map(|c| f64::from_le_bytes(c.try_into().expect("8 bytes")) as f32)
                .collect(),
            shape,
        }),
        d if d.starts_with("<U") && shape.is_empty() => {
            let n: usize = d[2..].parse().map_err(|_| format!("bad descr '{d}'"))?;
            let text: String = need(4 * n)?
                .chunks_exact(4)
                .map(|c| u32::from_le_bytes([c[0], c[1], c[2], c[3]]))
                .take_while(|&u| u != 0)
                .map(|u| char::from_u32(u).unwrap_or('\u{FFFD}'))
                .collect();
            Ok(NpyArray::Str(text))
        }
        d => Err(format!("dtype '{d}' is not supported (f2, f4, f8, 0-d U)")),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const EMBEDDED: &[u8] = include_bytes!("fixtures/en.npz");

    #[test]
    fn reads_the_embedded_model() {
        let npz = Npz::parse(EMBEDDED).unwrap();
        assert_eq!(npz.names().count(), 39);
        let e = npz.f32("E", &[1024, 128]).unwrap();
        assert!(e.iter().all(|x| x.is_finite()) && e.iter().any(|&x| x != 0.0));
        let cfg = npz.string("__config__").unwrap();
        assert!(cfg.contains("\"n_kv_heads\": 2"), "{cfg}");
        let err = npz.f32("E", &[128, 1024]).unwrap_err().to_string();
        assert!(err.contains("expected [128, 1024]"), "{err}");
        assert!(matches!(npz.f32("nope", &[1]), Err(NpzError::Missing(_))));
    }

    #[test]
    fn damaged_archives_are_errors_not_panics() {
        // Every truncation, and bytes flipped in every region of the file.
        for cut in (0..EMBEDDED.len())
            .step_by(39_989)
            .chain([EMBEDDED.len() - 1])
        {
            assert!(Npz::parse(&EMBEDDED[..cut]).is_err(), "cut at {cut}");
        }
        for at in (0..EMBEDDED.len()).step_by(24_989) {
            let mut b = EMBEDDED.to_vec();
            b[at] ^= 0xA5;
            let _ = Npz::parse(&b); // must return, Ok or Err
        }
        assert!(Npz::parse(b"PK\x05\x06").is_err());
        assert!(parse_npy(b"\x93NUMPY\x01\x00\xff\xff{").is_err());
    }
}
