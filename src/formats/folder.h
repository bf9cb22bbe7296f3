// Reading the files of a model folder: only where they resolve inside it.
//
// A model folder is often a cloned repository, and a symbolic link in it can point anywhere (a
// chat_template.jinja linked to ~/.ssh/id_rsa). Every file kiln reads from a folder goes through
// check_in_folder: after resolving every link, the file must lie inside the folder. One layout is let through
// by name: a Hugging Face hub cache snapshot, <repo>/snapshots/<revision>/, whose files are links to
// <repo>/blobs/; there the boundary is <repo>.
#pragma once

#include <string>

#include "core/status.h"

namespace kiln {

// An error naming `file` when it (links resolved) lies outside the folder `dir`. A file that does not exist
// is not checked here (the caller reports it missing).
Status check_in_folder(const std::string& dir, const std::string& file);

}  // namespace kiln
