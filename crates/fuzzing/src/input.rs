//! Splitting one fuzz input into messages: `[tag: u8][len: u16 LE][len bytes]...`; a short last
//! chunk takes what is left.

pub(crate) struct Chunk<'a> {
    pub tag: u8,
    pub bytes: &'a [u8],
}

pub(crate) fn chunks(mut data: &[u8]) -> Vec<Chunk<'_>> {
    let mut out = Vec::new();
    while let [tag, rest @ ..] = data {
        let (len, rest) = match rest {
            [a, b, rest @ ..] => (usize::from(u16::from_le_bytes([*a, *b])), rest),
            _ => (rest.len(), &rest[rest.len()..]),
        };
        let len = len.min(rest.len());
        out.push(Chunk {
            tag: *tag,
            bytes: &rest[..len],
        });
        data = &rest[len..];
    }
    out
}

/// The inverse of `chunks`, for seeds.
pub(crate) fn join(chunks: &[(u8, Vec<u8>)]) -> Vec<u8> {
    let mut out = Vec::new();
    for (tag, bytes) in chunks {
        out.push(*tag);
        let len = u16::try_from(bytes.len()).unwrap_or(u16::MAX);
        out.extend_from_slice(&len.to_le_bytes());
        out.extend_from_slice(&bytes[..usize::from(len)]);
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn join_and_chunks_round_trip() {
        let data = join(&[(1, b"abc".to_vec()), (2, vec![]), (3, vec![9; 300])]);
        let got: Vec<(u8, Vec<u8>)> = chunks(&data).into_iter().map(|c| (c.tag, c.bytes.to_vec())).collect();
        assert_eq!(got, vec![(1, b"abc".to_vec()), (2, vec![]), (3, vec![9; 300])]);
        assert_eq!(chunks(&[7, 5]).len(), 1);
        assert!(chunks(&[]).is_empty());
    }
}
