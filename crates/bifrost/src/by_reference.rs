//! Arguments passed by reference, the convention Bifröst's Thrift
//! services follow: the caller's library puts a call's arrays in one
//! allocation ([`pass_by_reference`]) whose pointer the call's header
//! carries, so the Gatekeeper lends all of them to the callee at once; the
//! callee reads them ([`read_argument`]) and returns global memory of its
//! own ([`return_array`]), whose control the reply hands to the caller.
//! `GlobalPtr` in `thrift/bifrost.thrift` is the IDL's side of it.

use crate::bifrost as idl;
use crate::dsm::client::{Dsm, DsmError};
use crate::dsm::GlobalPtr;
use crate::transport::{lent_pointer, return_pointer};

/// An argument passed by reference, as the DSM names it: its allocation,
/// where it starts inside it, and its length.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Argument {
    pub allocation: GlobalPtr,
    pub at: u64,
    pub length: usize,
}

/// A Thrift pointer as the DSM names it.
pub fn from_idl(pointer: &idl::GlobalPtr) -> Result<Argument, thrift::Error> {
    let length = usize::try_from(pointer.length)
        .map_err(|_| application_error(format!("negative length {}", pointer.length)))?;
    let offset = u64::try_from(pointer.offset)
        .map_err(|_| application_error(format!("negative offset {}", pointer.offset)))?;
    let at = u64::try_from(pointer.at)
        .map_err(|_| application_error(format!("negative position {}", pointer.at)))?;
    let allocation = GlobalPtr {
        node: pointer.node as u8,
        generation: pointer.generation as u8,
        offset,
    };
    Ok(Argument {
        allocation,
        at,
        length,
    })
}

/// An argument as the Thrift services pass it.
pub fn to_idl(argument: Argument) -> idl::GlobalPtr {
    idl::GlobalPtr::new(
        argument.allocation.node as i8,
        argument.allocation.generation as i8,
        argument.allocation.offset as i64,
        argument.length as i64,
        argument.at as i64,
    )
}

/// A whole allocation of `length` bytes as one argument.
pub fn whole(allocation: GlobalPtr, length: usize) -> Argument {
    Argument {
        allocation,
        at: 0,
        length,
    }
}

/// What the caller's library does before a call: one allocation holding
/// every array, in order, and an argument for each. The call passes the
/// allocation's pointer in its header ([`crate::transport::CallHandle`]).
pub fn pass_by_reference(
    dsm: &Dsm,
    arrays: &[&[u8]],
) -> Result<(GlobalPtr, Vec<Argument>), DsmError> {
    let total: usize = arrays.iter().map(|array| array.len()).sum();
    let allocation = dsm.alloc(total.max(1) as u64)?;
    let mut arguments = Vec::with_capacity(arrays.len());
    let mut at = 0u64;
    for array in arrays {
        freed_on_error(dsm, allocation, dsm.write_at(allocation, at, array))?;
        arguments.push(Argument {
            allocation,
            at,
            length: array.len(),
        });
        at += array.len() as u64;
    }
    Ok((allocation, arguments))
}

/// `result`, having freed `allocation` (best effort) if it is an error:
/// returned with its pointer dropped, the allocation could be freed by
/// nobody (the Gatekeeper's rules give its control to its maker alone).
pub fn freed_on_error<T>(
    dsm: &Dsm,
    allocation: GlobalPtr,
    result: Result<T, DsmError>,
) -> Result<T, DsmError> {
    if result.is_err() {
        if let Err(error) = dsm.free(allocation) {
            tracing::warn!(%error, "freeing an allocation after a failed write");
        }
    }
    result
}

pub fn application_error(message: String) -> thrift::Error {
    thrift::Error::Application(thrift::ApplicationError::new(
        thrift::ApplicationErrorKind::Unknown,
        message,
    ))
}

pub fn dsm_error(error: DsmError) -> thrift::Error {
    application_error(error.to_string())
}

/// Reads an argument the call lent. An argument outside the allocation
/// the call's header carries is refused: the Gatekeeper lends the callee
/// that one allocation for the call, but its ACL keys on the callee's
/// address, so the callee could also read what other calls lent it at the
/// same time, and a caller naming such memory in its arguments would get
/// it read for them.
pub fn read_argument(dsm: &Dsm, argument: &Argument) -> Result<Vec<u8>, thrift::Error> {
    let lent = lent_pointer().and_then(|pointer| GlobalPtr::from_address(&pointer));
    if lent != Some(argument.allocation) {
        return Err(application_error(format!(
            "refused: an argument in allocation {:?}, not the one the call lent ({lent:?})",
            argument.allocation
        )));
    }
    dsm.read_vec_at(argument.allocation, argument.at, argument.length)
        .map_err(dsm_error)
}

/// Puts `result` in an allocation of the callee's and returns it: the
/// reply's header carries it, and its control passes to the caller.
pub fn return_array(dsm: &Dsm, result: &[u8]) -> thrift::Result<idl::GlobalPtr> {
    let allocation = dsm.alloc(result.len().max(1) as u64).map_err(dsm_error)?;
    freed_on_error(dsm, allocation, dsm.write(allocation, result)).map_err(dsm_error)?;
    // The caller controls it from the reply on: the callee forgets it.
    dsm.forget(allocation);
    return_pointer(allocation.to_address());
    Ok(to_idl(whole(allocation, result.len())))
}
