//! NumPy `.npz` archives (what `numpy.savez[_compressed]` writes): a zip file whose members
//! are `.npy` arrays. The archive is read by `zip` (stored and deflate members, CRC-checked)
//! and each member by `npyz`; this module keeps what the example needs from them: float
//! arrays (`<f2`, `<f4`, `<f8`, C order) widened or narrowed to f32, and 0-d unicode strings
//! (`<U<n>`), by name.
//!
//! A truncated or corrupted file gives an [`NpzError`], never a panic: a member's element
//! count times its item size must fit in the bytes the member holds before any element is
//! read, so a damaged shape cannot ask for an oversized allocation.

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

/// Parses one `.npy` image.
fn parse_npy(b: &[u8]) -> Result<NpyArray, String> {
    let npy = npyz::NpyFile::new(b).map_err(|e| format!("not an .npy array: {e}"))?;
    if npy.order() == npyz::Order::Fortran {
        return Err("Fortran-order arrays are not supported".into());
    }
    let shape = npy
        .shape()
        .iter()
        .map(|&d| usize::try_from(d).map_err(|_| format!("dimension {d} does not fit usize")))
        .collect::<Result<Vec<usize>, String>>()?;
    let count = shape
        .iter()
        .try_fold(1usize, |a, &d| a.checked_mul(d))
        .ok_or("shape overflows")?;
    let dtype = npy.dtype();
    let item = dtype.num_bytes().ok_or("variable-size dtype")?;
    let need = count.checked_mul(item).ok_or("size overflows")?;
    if need > b.len() {
        return Err(format!(
            "{count} elements of {item} bytes, {} bytes present",
            b.len()
        ));
    }
    let descr = match &dtype {
        npyz::DType::Plain(t) => t.to_string(),
        other => return Err(format!("dtype {} is not supported", other.descr())),
    };
    let read = |e: std::io::Error| format!("{descr} data: {e}");
    let floats = |data: Vec<f32>| NpyArray::F32 {
        shape: shape.clone(),
        data,
    };
    match descr.as_str() {
        "<f2" => Ok(floats(
            npy.into_vec::<half::f16>()
                .map_err(read)?
                .into_iter()
                .map(half::f16::to_f32)
                .collect(),
        )),
        "<f4" => Ok(floats(npy.into_vec::<f32>().map_err(read)?)),
        "<f8" => Ok(floats(
            npy.into_vec::<f64>()
                .map_err(read)?
                .into_iter()
                .map(|x| x as f32)
                .collect(),
        )),
        d if d.starts_with("<U") && shape.is_empty() => {
            let mut v = npy.into_vec::<String>().map_err(read)?;
            Ok(NpyArray::Str(v.pop().unwrap_or_default()))
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
