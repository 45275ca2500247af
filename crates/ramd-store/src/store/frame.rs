//! The layout of a frame, several pages compressed together as one
//! object: how many pages it holds and its header.

/// Pages one multi-page frame holds at most.
pub(crate) const FRAME_PAGES: usize = 16;
/// Bytes before a frame's compressed data: first slot, page count, codec,
/// a spare byte, compressed length (u32 LE).
pub(crate) const FRAME_HEADER: usize = 8;

pub(crate) fn frame_len(header: &[u8; FRAME_HEADER]) -> usize {
    u32::from_le_bytes(header[4..8].try_into().expect("4 bytes")) as usize
}
