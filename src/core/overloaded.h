// Overloaded: a visitor from one lambda per alternative, so that std::visit over a variant without a case for
// one of its alternatives is a compile error (no generic fallback that silently does nothing).
#pragma once

namespace kiln {

template <class... Fs>
struct Overloaded : Fs... {
  using Fs::operator()...;
};
template <class... Fs>
Overloaded(Fs...) -> Overloaded<Fs...>;

}  // namespace kiln
