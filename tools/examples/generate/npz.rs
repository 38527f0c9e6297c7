//! A reader for NumPy `.npz` archives (what `numpy.savez[_compressed]` writes): a zip file
//! whose members are `.npy` arrays.
//!
//! Zip: the end-of-central-directory record is found by scanning back from the end (it is at
//! most 65 557 bytes from it); each central-directory entry gives a member's name, method
//! (0 stored, 8 deflate), sizes and local-header offset; the local header's name and extra
//! lengths give where the data starts. Zip64 is refused (numpy writes it only for members of
//! 4 GiB and more). Deflate is inflated by `miniz_oxide`, capped at the declared size.
//!
//! `.npy` (format 1.0 / 2.0 / 3.0): magic `\x93NUMPY`, version, header length, a Python-dict
//! header with `descr`, `fortran_order` and `shape`; little-endian `<f2`, `<f4`, `<f8` and
//! `<U<n>` (UTF-32 strings) are read, C order only.
//!
//! Every offset and length is checked against the buffer before it is used: a truncated or
//! corrupted file gives an [`NpzError`], never a panic or an oversized allocation.

use std::collections::BTreeMap;

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

fn u16_at(b: &[u8], at: usize) -> Option<u16> {
    Some(u16::from_le_bytes(b.get(at..at + 2)?.try_into().ok()?))
}

fn u32_at(b: &[u8], at: usize) -> Option<u32> {
    Some(u32::from_le_bytes(b.get(at..at + 4)?.try_into().ok()?))
}

fn zip_err(msg: impl Into<String>) -> NpzError {
    NpzError::Zip(msg.into())
}

impl Npz {
    /// Parses an archive held in memory.
    pub fn parse(bytes: &[u8]) -> Result<Self, NpzError> {
        const EOCD: u32 = 0x0605_4b50;
        let lo = bytes.len().saturating_sub(22 + 65_535);
        let eocd = (lo..=bytes.len().saturating_sub(22))
            .rev()
            .find(|&i| u32_at(bytes, i) == Some(EOCD))
            .ok_or_else(|| zip_err("no end-of-central-directory record"))?;
        let entries = u16_at(bytes, eocd + 10).ok_or_else(|| zip_err("truncated EOCD"))? as usize;
        let cd_size = u32_at(bytes, eocd + 12).ok_or_else(|| zip_err("truncated EOCD"))? as usize;
        let cd_off = u32_at(bytes, eocd + 16).ok_or_else(|| zip_err("truncated EOCD"))? as usize;
        if cd_off == 0xFFFF_FFFF || cd_size == 0xFFFF_FFFF {
            return Err(zip_err("zip64 archives are not supported"));
        }
        if cd_off.checked_add(cd_size).is_none_or(|end| end > eocd) {
            return Err(zip_err(format!(
                "central directory [{cd_off}, +{cd_size}) runs past its end record at {eocd}"
            )));
        }
        let mut arrays = BTreeMap::new();
        let mut at = cd_off;
        for i in 0..entries {
            let entry_at = at;
            let bad = || {
                zip_err(format!(
                    "central directory entry {i} at offset {entry_at} is truncated"
                ))
            };
            if u32_at(bytes, at) != Some(0x0201_4b50) {
                return Err(zip_err(format!(
                    "central directory entry {i}: bad signature at {at}"
                )));
            }
            let method = u16_at(bytes, at + 10).ok_or_else(bad)?;
            let csize = u32_at(bytes, at + 20).ok_or_else(bad)? as usize;
            let usize_ = u32_at(bytes, at + 24).ok_or_else(bad)? as usize;
            let name_len = u16_at(bytes, at + 28).ok_or_else(bad)? as usize;
            let extra_len = u16_at(bytes, at + 30).ok_or_else(bad)? as usize;
            let comment_len = u16_at(bytes, at + 32).ok_or_else(bad)? as usize;
            let local = u32_at(bytes, at + 42).ok_or_else(bad)? as usize;
            let name = bytes.get(at + 46..at + 46 + name_len).ok_or_else(bad)?;
            let name = String::from_utf8_lossy(name).into_owned();
            at += 46 + name_len + extra_len + comment_len;
            if csize == 0xFFFF_FFFF || usize_ == 0xFFFF_FFFF || local == 0xFFFF_FFFF {
                return Err(zip_err(format!("{name}: zip64 members are not supported")));
            }
            // The local header repeats name and extra with lengths of its own.
            if u32_at(bytes, local) != Some(0x0403_4b50) {
                return Err(zip_err(format!("{name}: bad local header at {local}")));
            }
            let lname = u16_at(bytes, local + 26).ok_or_else(bad)? as usize;
            let lextra = u16_at(bytes, local + 28).ok_or_else(bad)? as usize;
            let start = local + 30 + lname + lextra;
            let data = start
                .checked_add(csize)
                .and_then(|end| bytes.get(start..end))
                .ok_or_else(|| {
                    zip_err(format!(
                        "{name}: data [{start}, +{csize}) is past the end of the file"
                    ))
                })?;
            let raw = match method {
                0 if csize == usize_ => data.to_vec(),
                0 => {
                    return Err(zip_err(format!(
                        "{name}: stored member with two different sizes"
                    )))
                }
                8 => miniz_oxide::inflate::decompress_to_vec_with_limit(data, usize_).map_err(
                    |e| zip_err(format!("{name}: deflate data is corrupt ({:?})", e.status)),
                )?,
                m => {
                    return Err(zip_err(format!(
                        "{name}: compression method {m} is not supported"
                    )))
                }
            };
            if raw.len() != usize_ {
                return Err(zip_err(format!(
                    "{name}: inflated to {} bytes, the directory says {usize_}",
                    raw.len()
                )));
            }
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
