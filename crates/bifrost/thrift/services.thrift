// The thesis's workloads (§7): ping, echo, and arrays passed by reference.
include "bifrost.thrift"


service Ping {
  void ping(),
}

service Echo {
  binary echo(1: binary data),
}

// As the thesis's (§7.5): each returns a new array of the callee's, and
// the caller controls it after the reply.
service Arrays {
  // The array behind `array` with `value` added to every byte (wrapping).
  bifrost.GlobalPtr increment_array(1: bifrost.GlobalPtr array, 2: i8 value),
  // a + b, bytewise and wrapping.
  bifrost.GlobalPtr add_arrays(1: bifrost.GlobalPtr a, 2: bifrost.GlobalPtr b),
}

// The baseline of the thesis's comparison: the same services with the
// arrays passed by value.
service ArraysByValue {
  binary increment_array(1: binary array, 2: i8 value),
  binary add_arrays(1: binary a, 2: binary b),
}
