from ._events import (
    EVENTS,
    Decided,
    DecidedPaused,
    EpochEnd,
    Event,
    Exploited,
    JournalRepaired,
    PartitionsMoved,
    RunExtended,
    RunFailed,
    RunFinished,
    RunInterrupted,
    RunResumed,
    RunStarted,
    SearchState,
    StateLost,
    SubEpoch,
    SubEpochAborted,
    SubEpochStarted,
    TaskKind,
    Traffic,
    TrialAdded,
    TrialCreated,
    TrialEnded,
    TrialRetried,
    TrialRolledBack,
    TrialStatus,
    TrialStopAsked,
    TrialTakenUp,
    WorkerLost,
    WorkerNotReplaced,
    WorkerProgress,
    WorkerReplaced,
    WorkersRestarted,
    improved,
    parse_event,
)
from ._journal_lines import DamagedLine
from ._ledger import Ledger, TrialFacts
from ._legacy_pickle import UntrustedStateError
from ._lock import StoreInUseError
from ._run_info import RunInfoError
from ._run_store import BEST, STATE_FORMAT, STOP_FILE, RunStore
from ._state_codec import (
    StateFormatError,
    TensorBytes,
    frames,
    pack_tensors,
    parse,
    parse_view,
    read_exactly,
    read_message,
    unpack_tensors,
    write_message,
)
from ._state_files import read_state_file, remove_state_file, write_state_file
from ._stop_cause import StopCause
from ._trust import TrustKeyError, UntrustedCodeError

__all__ = ["BEST", "EVENTS", "STATE_FORMAT", "STOP_FILE", "DamagedLine", "Decided", "DecidedPaused", "EpochEnd",
           "Event", "Exploited", "JournalRepaired", "Ledger", "PartitionsMoved", "RunExtended", "RunFailed",
           "RunFinished", "RunInfoError", "RunInterrupted", "RunResumed", "RunStarted", "RunStore", "SearchState",
           "StateFormatError", "StateLost", "StopCause", "StoreInUseError", "SubEpoch", "SubEpochAborted",
           "SubEpochStarted", "TaskKind", "TensorBytes", "Traffic", "TrialAdded", "TrialCreated", "TrialEnded",
           "TrialFacts", "TrialRetried", "TrialRolledBack", "TrialStatus", "TrialStopAsked", "TrialTakenUp",
           "TrustKeyError", "UntrustedCodeError", "UntrustedStateError", "WorkerLost", "WorkerNotReplaced",
           "WorkerProgress", "WorkerReplaced", "WorkersRestarted", "improved", "frames", "pack_tensors", "parse",
           "parse_event", "parse_view", "read_exactly", "read_message", "read_state_file", "remove_state_file",
           "unpack_tensors", "write_message", "write_state_file"]
