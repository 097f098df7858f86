// An example of a user's own Bifröst service (see the README's "Bifröst
// services"). Its text is passed by reference: the caller's library puts
// it in global memory and passes a GlobalPtr, and the Gatekeeper lends it
// to the service for the call.
include "bifrost.thrift"

exception NoWords {
  1: string why,
}

service Words {
  // How many whitespace-separated words the text behind `text` holds.
  i64 count(1: bifrost.GlobalPtr text),
  // The text in capitals, in a new array of the service's, whose control
  // passes to the caller with the reply. Text with no words is refused.
  bifrost.GlobalPtr shout(1: bifrost.GlobalPtr text) throws (1: NoWords no_words),
}
