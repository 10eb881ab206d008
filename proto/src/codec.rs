//! The one encoding of function-task arguments and results: bincode (standard configuration)
//! over serde. Workers decode what clients encode and the other way round.

use serde::Serialize;
use serde::de::DeserializeOwned;
use thiserror::Error;

/// A value could not be encoded or decoded.
#[derive(Debug, Error)]
pub enum CodecError {
    /// Serialization failed (a type serde cannot represent in bincode).
    #[error("cannot encode value: {0}")]
    Encode(#[from] bincode::error::EncodeError),
    /// The bytes are not a value of the expected type.
    #[error("cannot decode value: {0}")]
    Decode(#[from] bincode::error::DecodeError),
    /// The bytes held a value followed by more bytes.
    #[error("cannot decode value: {extra} unexpected trailing bytes")]
    Trailing {
        /// How many bytes were left over.
        extra: usize,
    },
}

/// Encodes a value as function-task bytes.
pub fn encode<T: Serialize + ?Sized>(value: &T) -> Result<Vec<u8>, CodecError> {
    Ok(bincode::serde::encode_to_vec(
        value,
        bincode::config::standard(),
    )?)
}

/// Decodes function-task bytes, rejecting trailing garbage.
pub fn decode<T: DeserializeOwned>(bytes: &[u8]) -> Result<T, CodecError> {
    let (value, read) = bincode::serde::decode_from_slice(bytes, bincode::config::standard())?;
    if read != bytes.len() {
        return Err(CodecError::Trailing {
            extra: bytes.len() - read,
        });
    }
    Ok(value)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip_and_errors() {
        let bytes = encode(&(7u32, "seven".to_string())).unwrap();
        let back: (u32, String) = decode(&bytes).unwrap();
        assert_eq!(back, (7, "seven".to_string()));
        assert!(decode::<u64>(&[]).is_err());
        let mut long = encode(&1u8).unwrap();
        long.push(0);
        assert!(matches!(
            decode::<u8>(&long),
            Err(CodecError::Trailing { extra: 1 })
        ));
    }
}
