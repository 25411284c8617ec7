//! EventMesh's classic TCP frames (`adaptor::eventmesh_tcp`) on arbitrary bytes from a
//! connection. Never panic; a decoded frame lies within its input; every shorter prefix of it
//! is "not all there yet" (or the same refusal); a decoded header encodes to a frame that
//! decodes to the same package.
#![no_main]

use evmesh_protocol::adaptor::eventmesh_tcp::{decode, encode, MAX_FRAME};
use libfuzzer_sys::fuzz_target;

fuzz_target!(|data: &[u8]| {
    let whole = decode(data);
    let Ok(Some((pkg, used))) = whole else {
        if let Ok(None) = whole {
            for cut in [0, data.len() / 2] {
                assert!(matches!(decode(&data[..cut]), Ok(None) | Err(_)), "a prefix of a partial frame decoded");
            }
        }
        return;
    };
    assert!(used <= data.len() && used >= 21, "{used} of {}", data.len());
    for cut in [0, 13, 17, used / 2, used - 1] {
        assert_eq!(decode(&data[..cut.min(used - 1)]), Ok(None), "a prefix of {cut} bytes");
    }
    if let Some(h) = &pkg.header {
        // Our header JSON may be a little longer than the one read (`properties`, `command`).
        let again = match encode(h, &pkg.body) {
            Ok(again) => again,
            Err(_) => return assert!(used > MAX_FRAME - 1024, "a frame of {used} bytes not encoded again"),
        };
        let (back, n) = decode(&again).expect("our frame decodes").expect("whole");
        assert_eq!((back, n), (pkg, again.len()));
    }
});
