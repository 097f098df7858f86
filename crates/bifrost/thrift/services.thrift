// The thesis's workloads (§7): ping, echo, and arrays passed by reference.
include "bifrost.thrift"


service Ping {
  void ping(),
}

service Echo {
  binary echo(1: binary data),
}

service Arrays {
  // Adds one to every byte of the array behind `array`, in place.
  void increment_array(1: bifrost.GlobalPtr array),
  // Writes a + b (bytewise, wrapping) into `sum`.
  void add_arrays(1: bifrost.GlobalPtr a, 2: bifrost.GlobalPtr b, 3: bifrost.GlobalPtr sum),
}

// The baseline of the thesis's comparison: the same sum with the arrays
// passed by value.
service ArraysByValue {
  binary add_arrays(1: binary a, 2: binary b),
}
